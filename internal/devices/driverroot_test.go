package devices

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The library is found where each distribution's driver container puts
// it, the first directory winning; a root without it, or no root at all,
// is an error naming the root and what was searched.
func TestDriverRootLibrary(t *testing.T) {
	put := func(root, dir string) string {
		p := filepath.Join(root, dir, libNVML)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ubuntu := t.TempDir()
	want := put(ubuntu, "usr/lib/x86_64-linux-gnu")
	put(ubuntu, "usr/lib") // later in the order: not chosen
	if got, err := DriverRootLibrary(ubuntu); err != nil || got != want {
		t.Errorf("Ubuntu layout: %q, %v; want %q", got, err, want)
	}
	rhel := t.TempDir()
	want = put(rhel, "usr/lib64")
	if got, err := DriverRootLibrary(rhel); err != nil || got != want {
		t.Errorf("RHEL layout: %q, %v; want %q", got, err, want)
	}
	empty := t.TempDir()
	for _, tc := range []struct{ root, want string }{
		{empty, "gpu.driverRoot " + empty + ": no libnvidia-ml.so.1 in usr/lib/x86_64-linux-gnu, "},
		{filepath.Join(empty, "absent"), "gpu.driverRoot " + filepath.Join(empty, "absent") + ": "},
		{"run/nvidia/driver", "want an absolute path"},
	} {
		if _, err := DriverRootLibrary(tc.root); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DriverRootLibrary(%q) = %v; want an error containing %q", tc.root, err, tc.want)
		}
	}
}
