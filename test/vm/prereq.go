package vm

import (
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// hostTools maps each host command the VM tests run to its Debian package.
var hostTools = map[string]string{
	"qemu-system-x86_64": "qemu-system-x86",
	"qemu-img":           "qemu-utils",
	"debootstrap":        "debootstrap",
	"mkfs.ext4":          "e2fsprogs",
	"xz":                 "xz-utils",
	"ssh":                "openssh-client",
	"scp":                "openssh-client",
	"ssh-keygen":         "openssh-client",
	"python3":            "python3",
	"dpkg-deb":           "dpkg",
	"go":                 "golang (or Go from go.dev)",
	// The real node's parts (hack/nodebin.sh: runc with seccomp, cgo).
	"gcc":        "gcc",
	"pkg-config": "pkg-config",
}

// hostHeaders maps a header the node parts' build needs to its package.
var hostHeaders = map[string]string{"/usr/include/seccomp.h": "libseccomp-dev"}

// HostPackages is the Debian package list the VM tests need on the host.
const HostPackages = "qemu-system-x86 qemu-utils debootstrap e2fsprogs xz-utils openssh-client python3 gcc pkg-config libseccomp-dev"

// RequireHostTools fails the test (never skips) when a host tool is
// missing, naming the Debian packages to install. Building the image also
// needs root.
func RequireHostTools(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("vm: VM tests boot a QEMU guest (minutes); skipped under -short: run make test-vm")
	}
	var missing, pkgs []string
	seen := map[string]bool{}
	for tool, pkg := range hostTools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
			if !seen[pkg] {
				seen[pkg] = true
				pkgs = append(pkgs, pkg)
			}
		}
	}
	for h, pkg := range hostHeaders {
		if _, err := os.Stat(h); err != nil {
			missing = append(missing, h)
			if !seen[pkg] {
				seen[pkg] = true
				pkgs = append(pkgs, pkg)
			}
		}
	}
	sort.Strings(missing)
	sort.Strings(pkgs)
	if len(missing) > 0 {
		t.Fatalf("vm: missing host tools %s: install them with\n    apt-get install -y %s\n(the full list for the VM tests: %s)",
			strings.Join(missing, ", "), strings.Join(pkgs, " "), HostPackages)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("vm: the VM tests must run as root (hack/vm/build-image.sh runs debootstrap and chroot)")
	}
}
