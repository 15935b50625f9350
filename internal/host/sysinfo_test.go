package host

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBootID(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    string
		wantErr error
	}{
		{name: "kernel format", content: "0f2c1d1e-6c5a-4b7e-9f0e-3a1b2c3d4e5f\n", want: "0f2c1d1e-6c5a-4b7e-9f0e-3a1b2c3d4e5f"},
		{name: "upper case normalised", content: "0F2C1D1E-6C5A-4B7E-9F0E-3A1B2C3D4E5F", want: "0f2c1d1e-6c5a-4b7e-9f0e-3a1b2c3d4e5f"},
		{name: "empty", content: "", wantErr: ErrInvalidBootID},
		{name: "no dashes", content: "0f2c1d1e6c5a4b7e9f0e3a1b2c3d4e5f", wantErr: ErrInvalidBootID},
		{name: "not hex", content: "zf2c1d1e-6c5a-4b7e-9f0e-3a1b2c3d4e5f", wantErr: ErrInvalidBootID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Paths{BootIDFile: writeTemp(t, "boot_id", tc.content)}.BootID()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("BootID error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("BootID = %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := Paths{BootIDFile: filepath.Join(t.TempDir(), "nope")}.BootID()
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("BootID error = %v, want ErrNotExist", err)
		}
	})
	t.Run("this host", func(t *testing.T) {
		a, err := Paths{}.BootID()
		if err != nil {
			t.Fatalf("BootID of this host: %v", err)
		}
		if b, _ := (Paths{}).BootID(); a != b {
			t.Fatalf("boot ID changed between reads: %s, %s", a, b)
		}
	})
}

func TestOSRelease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    OSRelease // Fields not compared
		field   [2]string // one extra field to check, if set
	}{
		{
			name: "debian 12",
			content: `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
`,
			want:  OSRelease{ID: "debian", VersionID: "12", PrettyName: "Debian GNU/Linux 12 (bookworm)"},
			field: [2]string{"VERSION_CODENAME", "bookworm"},
		},
		{
			name:    "ubuntu with comments and blank lines",
			content: "# comment\n\nID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n",
			want:    OSRelease{ID: "ubuntu", VersionID: "24.04", PrettyName: "Ubuntu 24.04.1 LTS"},
			field:   [2]string{"ID_LIKE", "debian"},
		},
		{
			name:    "single quotes and escapes",
			content: "ID='rhel'\nVERSION_ID='9.4'\nPRETTY_NAME=\"Say \\\"hi\\\" \\$HOME \\\\ ok\"\n",
			want:    OSRelease{ID: "rhel", VersionID: "9.4", PrettyName: `Say "hi" $HOME \ ok`},
		},
		{
			name:    "defaults when absent",
			content: "NAME=Thing\nmalformed line\n=novalue\n",
			want:    OSRelease{ID: "linux", PrettyName: "Linux"},
			field:   [2]string{"NAME", "Thing"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Paths{OSReleaseFile: writeTemp(t, "os-release", tc.content)}.OSRelease()
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tc.want.ID || got.VersionID != tc.want.VersionID || got.PrettyName != tc.want.PrettyName {
				t.Fatalf("OSRelease = {ID:%q VersionID:%q PrettyName:%q}, want %+v", got.ID, got.VersionID, got.PrettyName, tc.want)
			}
			if tc.field[0] != "" && got.Fields[tc.field[0]] != tc.field[1] {
				t.Fatalf("Fields[%s] = %q, want %q", tc.field[0], got.Fields[tc.field[0]], tc.field[1])
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		if _, err := (Paths{OSReleaseFile: filepath.Join(t.TempDir(), "nope")}).OSRelease(); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("error = %v, want ErrNotExist", err)
		}
	})
}

func TestKernelRelease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    string
		wantErr bool
	}{
		{name: "debian kernel", content: "6.1.0-28-amd64\n", want: "6.1.0-28-amd64"},
		{name: "empty file", content: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Paths{KernelReleaseFile: writeTemp(t, "osrelease", tc.content)}.KernelRelease()
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("KernelRelease = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
	t.Run("this host matches uname", func(t *testing.T) {
		got, err := Paths{}.KernelRelease()
		if err != nil {
			t.Fatal(err)
		}
		var u syscall.Utsname
		if err := syscall.Uname(&u); err != nil {
			t.Fatal(err)
		}
		if want := utsString(u.Release[:]); got != want || got == "" {
			t.Fatalf("KernelRelease = %q, uname says %q", got, want)
		}
	})
}

func TestMachineID(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
		fails               bool
	}{
		{name: "systemd format", content: "3d1219c7c4c5404aaa1f6d2a48adfda4\n", want: "3d1219c7c4c5404aaa1f6d2a48adfda4"},
		{name: "upper case normalised", content: "3D1219C7C4C5404AAA1F6D2A48ADFDA4", want: "3d1219c7c4c5404aaa1f6d2a48adfda4"},
		{name: "empty (an image not yet booted)", content: "", fails: true},
		{name: "uninitialized", content: "uninitialized\n", fails: true},
		{name: "a UUID with dashes", content: "3d1219c7-c4c5-404a-aa1f-6d2a48adfda4", fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Paths{MachineIDFile: writeTemp(t, "machine-id", tc.content)}.MachineID()
			if (err != nil) != tc.fails || got != tc.want {
				t.Fatalf("MachineID = %q, %v; want %q, error %v", got, err, tc.want, tc.fails)
			}
		})
	}
	if _, err := (Paths{MachineIDFile: filepath.Join(t.TempDir(), "nope")}).MachineID(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("MachineID of a missing file: %v, want ErrNotExist", err)
	}
}

func TestBootTime(t *testing.T) {
	stat := "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1765000000\nprocesses 7\n"
	got, err := Paths{ProcStatFile: writeTemp(t, "stat", stat)}.BootTime()
	if err != nil || !got.Equal(time.Unix(1765000000, 0)) {
		t.Fatalf("BootTime = %v, %v; want %v", got, err, time.Unix(1765000000, 0))
	}
	for name, content := range map[string]string{
		"no btime line": "cpu  1 2 3 4\nctxt 6\n",
		"not a number":  "btime soon\n",
		"zero":          "btime 0\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeTemp(t, "stat", content)
			if got, err := (Paths{ProcStatFile: path}).BootTime(); err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("BootTime = %v, %v; want an error naming %s", got, err, path)
			}
		})
	}
	t.Run("this host", func(t *testing.T) {
		got, err := Paths{}.BootTime()
		if err != nil {
			t.Fatalf("BootTime of this host: %v", err)
		}
		if got.After(time.Now()) || time.Since(got) > 10*365*24*time.Hour {
			t.Fatalf("BootTime of this host = %v: not in the past ten years", got)
		}
	})
}
