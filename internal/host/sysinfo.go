package host

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Default locations read by Paths. A zero field of Paths means its default.
const (
	DefaultBootIDPath        = "/proc/sys/kernel/random/boot_id"
	DefaultOSReleasePath     = "/etc/os-release"
	DefaultOSReleaseFallback = "/usr/lib/os-release"
	DefaultKernelReleasePath = "/proc/sys/kernel/osrelease"
	DefaultMachineIDPath     = "/etc/machine-id"
	DefaultProcStatPath      = "/proc/stat"
)

// Paths names the files the host facts are read from; tests point them into
// a temporary directory. The zero value reads the real host.
type Paths struct {
	// BootID holds the kernel's boot ID, a UUID that changes every boot.
	BootIDFile string
	// OSRelease is os-release(5). When it is empty, /etc/os-release is
	// read and, if absent, /usr/lib/os-release.
	OSReleaseFile string
	// KernelRelease holds the kernel release (`uname -r`). When it is empty
	// /proc/sys/kernel/osrelease is read, falling back to uname(2).
	KernelReleaseFile string
	// MachineIDFile is machine-id(5): 32 lowercase hex digits, set at
	// install and kept across reboots and upgrades.
	MachineIDFile string
	// ProcStatFile is proc(5)'s /proc/stat, whose btime line is when this
	// boot began.
	ProcStatFile string
}

// BootTime returns when this boot began, on this host's clock: the btime
// line of /proc/stat (seconds since the epoch). The kernel reckons it from
// the current time less the time since boot, so a clock stepped after the
// boot (NTP at start-up) moves it too: read it again for each use rather
// than keeping it. Timestamps the kubelet writes in this boot (a pod
// condition's lastTransitionTime) are at or after it.
func (p Paths) BootTime() (time.Time, error) {
	path := p.ProcStatFile
	if path == "" {
		path = DefaultProcStatPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, fmt.Errorf("host: read boot time: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		v, ok := strings.CutPrefix(line, "btime ")
		if !ok {
			continue
		}
		secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || secs <= 0 {
			return time.Time{}, fmt.Errorf("host: boot time in %s: %q is not seconds since the epoch", path, strings.TrimSpace(line))
		}
		return time.Unix(secs, 0), nil
	}
	return time.Time{}, fmt.Errorf("host: boot time: no btime line in %s", path)
}

// MachineID returns machine-id(5). It tells two hosts apart that were
// given one node name (a cloned image, a typo): the agent's holder identity
// includes it.
func (p Paths) MachineID() (string, error) {
	path := p.MachineIDFile
	if path == "" {
		path = DefaultMachineIDPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("host: read machine ID: %w", err)
	}
	s := strings.TrimSpace(string(data))
	if len(s) != 32 || strings.Trim(strings.ToLower(s), "0123456789abcdef") != "" {
		return "", fmt.Errorf("host: machine ID in %s: want 32 hex digits, found %q", path, s)
	}
	return strings.ToLower(s), nil
}

// BootID returns the current boot ID in lowercase canonical form. A reboot
// step is done when the boot ID differs from the one in its journal intent.
func (p Paths) BootID() (string, error) {
	path := p.BootIDFile
	if path == "" {
		path = DefaultBootIDPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("host: read boot ID: %w", err)
	}
	id, err := parseBootID(data)
	if err != nil {
		return "", fmt.Errorf("host: read boot ID from %s: %w", path, err)
	}
	return id, nil
}

func parseBootID(data []byte) (string, error) {
	s := strings.ToLower(strings.TrimSpace(string(data)))
	if len(s) != 36 {
		return "", fmt.Errorf("%w: %q", ErrInvalidBootID, s)
	}
	for i, r := range s {
		switch i {
		case 8, 13, 18, 23:
			if r != '-' {
				return "", fmt.Errorf("%w: %q", ErrInvalidBootID, s)
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", r) {
				return "", fmt.Errorf("%w: %q", ErrInvalidBootID, s)
			}
		}
	}
	return s, nil
}

// OSRelease is the part of os-release(5) the agent verifies after an
// upgrade.
type OSRelease struct {
	// ID defaults to "linux" when absent, as os-release(5) says.
	ID string
	// VersionID is empty when absent (rolling releases, Debian testing).
	VersionID string
	// PrettyName defaults to "Linux" when absent.
	PrettyName string
	// Fields holds every variable of the file, unquoted.
	Fields map[string]string
}

// OSRelease reads and parses os-release.
func (p Paths) OSRelease() (OSRelease, error) {
	paths := []string{DefaultOSReleasePath, DefaultOSReleaseFallback}
	if p.OSReleaseFile != "" {
		paths = []string{p.OSReleaseFile}
	}
	var err error
	for _, path := range paths {
		var data []byte
		data, err = os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			break
		}
		return parseOSRelease(data), nil
	}
	return OSRelease{}, fmt.Errorf("host: read os-release: %w", err)
}

// parseOSRelease parses os-release(5): KEY=value lines, values optionally
// in single or double quotes, shell escapes (\" \\ \$ \`) in double quotes,
// comments and blank lines ignored, malformed lines skipped.
func parseOSRelease(data []byte) OSRelease {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			continue
		}
		fields[key] = unquoteShell(val)
	}
	r := OSRelease{
		ID:         fields["ID"],
		VersionID:  fields["VERSION_ID"],
		PrettyName: fields["PRETTY_NAME"],
		Fields:     fields,
	}
	if r.ID == "" {
		r.ID = "linux"
	}
	if r.PrettyName == "" {
		r.PrettyName = "Linux"
	}
	return r
}

func unquoteShell(v string) string {
	if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
		return v[1 : len(v)-1]
	}
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
		var b strings.Builder
		for i := 0; i < len(v); i++ {
			if v[i] == '\\' && i+1 < len(v) && strings.IndexByte("\"\\$`", v[i+1]) >= 0 {
				i++
			}
			b.WriteByte(v[i])
		}
		return b.String()
	}
	return v
}

// KernelRelease returns the running kernel's release, as `uname -r` prints
// it.
func (p Paths) KernelRelease() (string, error) {
	path := p.KernelReleaseFile
	if path == "" {
		path = DefaultKernelReleasePath
	}
	data, err := os.ReadFile(path)
	if err == nil {
		if s := strings.TrimSpace(string(data)); s != "" {
			return s, nil
		}
		err = errors.New("empty file")
	}
	if p.KernelReleaseFile != "" {
		return "", fmt.Errorf("host: read kernel release from %s: %w", path, err)
	}
	var u syscall.Utsname
	if uerr := syscall.Uname(&u); uerr != nil {
		return "", fmt.Errorf("host: read kernel release: %s: %w; uname: %w", path, err, uerr)
	}
	return utsString(u.Release[:]), nil
}

// utsString converts a NUL-terminated utsname field; its element type is
// int8 or uint8 depending on the architecture.
func utsString[T int8 | uint8](f []T) string {
	b := make([]byte, 0, len(f))
	for _, c := range f {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
