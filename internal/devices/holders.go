package devices

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Holder is one process that has a GPU device node open.
type Holder struct {
	PID  int
	Comm string // /proc/<pid>/comm
	// Unit is the systemd unit of the process (from /proc/<pid>/cgroup,
	// e.g. nvidia-dcgm.service), "" when it runs in no unit.
	Unit string
	// Pod is the pod UID when the process runs in a kubepods cgroup.
	Pod string
	// Device is the device node it holds, e.g. /dev/nvidia3.
	Device string
}

func (h Holder) String() string {
	var where []string
	if h.Unit != "" {
		where = append(where, "unit "+h.Unit)
	}
	if h.Pod != "" {
		where = append(where, "pod "+h.Pod)
	}
	s := fmt.Sprintf("%s (pid %d) holds %s", h.Comm, h.PID, h.Device)
	if len(where) > 0 {
		s += " [" + strings.Join(where, ", ") + "]"
	}
	return s
}

// HolderScan is the result of FindHolders.
type HolderScan struct {
	Holders []Holder
	// Unreadable lists the processes whose fd table could not be read
	// (permission denied: an agent without CAP_SYS_PTRACE, or a security
	// module in the way), sorted: they may hold a device unseen.
	Unreadable []int
}

// FindHolders lists every process that holds one of paths open, reading
// <procRoot>/<pid>/fd/* links the way fuser does ("" means /proc). This is
// how nvidia-smi decides "In use by another client": any open file
// descriptor on the GPU's /dev/nvidia<minor> node, whether or not the
// process runs CUDA work (an NVML session of a monitoring tool counts).
// Processes that exit during the scan are skipped. The result is sorted by
// PID, then device.
func FindHolders(procRoot string, paths []string) (HolderScan, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	want := map[string]bool{}
	for _, p := range paths {
		if p != "" {
			want[filepath.Clean(p)] = true
		}
	}
	var scan HolderScan
	if len(want) == 0 {
		return scan, nil
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return scan, fmt.Errorf("devices: listing device holders: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				scan.Unreadable = append(scan.Unreadable, pid)
			}
			continue // gone, or not a process
		}
		seen := map[string]bool{}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil {
				continue
			}
			target = strings.TrimSuffix(target, " (deleted)")
			if !want[target] || seen[target] {
				continue
			}
			seen[target] = true
			h := Holder{PID: pid, Device: target}
			if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
				h.Comm = strings.TrimSpace(string(b))
			}
			if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
				h.Unit, h.Pod = cgroupOwner(string(b))
			}
			scan.Holders = append(scan.Holders, h)
		}
	}
	slices.Sort(scan.Unreadable)
	slices.SortFunc(scan.Holders, func(a, b Holder) int {
		if a.PID != b.PID {
			return a.PID - b.PID
		}
		return strings.Compare(a.Device, b.Device)
	})
	return scan, nil
}

// cgroupOwner reads the systemd unit and the pod UID from a
// /proc/<pid>/cgroup file (v2 "0::/path" or v1 "N:name=systemd:/path").
func cgroupOwner(cgroup string) (unit, pod string) {
	for _, line := range strings.Split(cgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[0] != "0" && parts[1] != "name=systemd") {
			continue
		}
		for _, el := range strings.Split(parts[2], "/") {
			switch {
			case strings.Contains(el, "-pod") && strings.HasPrefix(el, "kubepods"):
				// kubepods-besteffort-pod<uid>.slice
				u := el[strings.Index(el, "-pod")+4:]
				pod = strings.ReplaceAll(strings.TrimSuffix(u, ".slice"), "_", "-")
			case strings.HasPrefix(el, "pod") && len(el) > 3 && pod == "":
				pod = el[3:] // cgroupfs driver: kubepods/besteffort/pod<uid>
			case strings.HasSuffix(el, ".service"):
				unit = el
			}
		}
		if unit != "" && pod != "" {
			unit = "" // a container's scope, not a host service
		}
		return unit, pod
	}
	return "", ""
}

// HolderPaths returns the device node of each UUID's GPU under devRoot
// ("" means /dev), in the order given. A GPU whose minor number is unknown
// is an error: a holder check that cannot name the node fails closed.
func (m *Manager) HolderPaths(devRoot string, uuids []string) (map[string]string, error) {
	gpus, err := m.List()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(uuids))
	for _, u := range uuids {
		i := slices.IndexFunc(gpus, func(g GPUInfo) bool { return g.UUID == u })
		if i < 0 {
			return nil, fmt.Errorf("%w %s", ErrUnknownGPU, u)
		}
		p := gpus[i].DevicePath(devRoot)
		if p == "" {
			return nil, fmt.Errorf("devices: %s: minor number unknown; cannot name its device node", u)
		}
		out[u] = p
	}
	return out, nil
}
