package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// libNVML is the NVML library's soname.
const libNVML = "libnvidia-ml.so.1"

// DriverRootLibDirs are the directories under a driver root searched for
// libnvidia-ml.so.1, in order: those of the NVIDIA Container Toolkit's
// driver-root lookup (Debian/Ubuntu multiarch, RHEL lib64, plain lib).
var DriverRootLibDirs = []string{
	"usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu",
	"usr/lib64", "lib64", "usr/lib", "lib",
}

// DriverRootLibrary finds libnvidia-ml.so.1 under root, the root of a
// driver that is not installed on the host itself (the GPU Operator's
// driver container mounts it at /run/nvidia/driver). The error names root
// and every directory searched.
func DriverRootLibrary(root string) (string, error) {
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("gpu.driverRoot %q: want an absolute path", root)
	}
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		if err == nil {
			err = fmt.Errorf("not a directory")
		}
		return "", fmt.Errorf("gpu.driverRoot %s: %w", root, err)
	}
	for _, d := range DriverRootLibDirs {
		p := filepath.Join(root, d, libNVML)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("gpu.driverRoot %s: no %s in %s (is the driver container running?)", root, libNVML, strings.Join(DriverRootLibDirs, ", "))
}
