package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MemCgroup is a memory cgroup this harness made for one process, so that
// the process's memory is read as systemd accounts a service: memory.current
// (cgroup v2) or memory.usage_in_bytes (v1), which count the page cache the
// process brought in (its binary's pages among them) as well as its
// anonymous memory.
type MemCgroup struct {
	Dir string // the cgroup's directory
	V2  bool
}

// CgroupMem is one reading of a MemCgroup. V1 and v2 name the same things
// differently: Anon is v2 "anon" / v1 "rss", File is "file" / "cache",
// FileMapped is "file_mapped" / "mapped_file".
type CgroupMem struct {
	Current    int64 `json:"currentBytes"` // memory.current / memory.usage_in_bytes
	Peak       int64 `json:"peakBytes"`    // memory.peak / memory.max_usage_in_bytes (0: not available)
	Anon       int64 `json:"anonBytes"`
	File       int64 `json:"fileBytes"`
	FileMapped int64 `json:"fileMappedBytes"`
	// Kernel is what Current holds besides Anon and File (v2 "kernel",
	// else Current - Anon - File; v1's usage_in_bytes is batched per CPU,
	// so there it may be off by some pages either way).
	Kernel int64 `json:"kernelBytes"`
}

// NewMemCgroup makes a memory cgroup named name: under cgroup v2 where it
// is mounted with the memory controller, else under the v1 memory
// hierarchy; in either, below this process's own cgroup if it can, else
// below the hierarchy's root. The error says why none could be made.
func NewMemCgroup(name string) (*MemCgroup, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own := ownCgroups()
	var why []string
	if m, ok := mounts["cgroup2"]; ok {
		for _, parent := range uniq(filepath.Join(m, own[""]), m) {
			if err := enableMemoryV2(parent); err != nil {
				why = append(why, err.Error())
				continue
			}
			dir := filepath.Join(parent, name)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				why = append(why, err.Error())
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "memory.current")); err != nil {
				_ = os.Remove(dir)
				why = append(why, fmt.Sprintf("%s: no memory.current", dir))
				continue
			}
			return &MemCgroup{Dir: dir, V2: true}, nil
		}
	} else {
		why = append(why, "cgroup2 is not mounted")
	}
	if m, ok := mounts["memory"]; ok {
		for _, parent := range uniq(filepath.Join(m, own["memory"]), m) {
			dir := filepath.Join(parent, name)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				why = append(why, err.Error())
				continue
			}
			return &MemCgroup{Dir: dir}, nil
		}
	} else {
		why = append(why, "no cgroup v1 memory hierarchy is mounted")
	}
	return nil, fmt.Errorf("bench: no memory cgroup could be made: %s", strings.Join(why, "; "))
}

// Wrap returns argv started inside the cgroup: a shell writes its own pid
// to cgroup.procs and execs argv, so every page the program faults in from
// its first instruction is charged to the cgroup (a process moved in after
// it started leaves its earlier charges behind). The pid is the program's.
func (c *MemCgroup) Wrap(argv []string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.Dir, "cgroup.procs")}, argv...)
}

// Read reads the cgroup's memory figures.
func (c *MemCgroup) Read() (CgroupMem, error) {
	var m CgroupMem
	cur, peak, stat := "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.stat"
	if c.V2 {
		cur, peak = "memory.current", "memory.peak"
	}
	v, err := readInt(filepath.Join(c.Dir, cur))
	if err != nil {
		return m, err
	}
	m.Current = v
	m.Peak, _ = readInt(filepath.Join(c.Dir, peak))
	b, err := os.ReadFile(filepath.Join(c.Dir, stat))
	if err != nil {
		return m, err
	}
	s := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		s[k], _ = strconv.ParseInt(v, 10, 64)
	}
	if c.V2 {
		m.Anon, m.File, m.FileMapped, m.Kernel = s["anon"], s["file"], s["file_mapped"], s["kernel"]
	} else {
		m.Anon, m.File, m.FileMapped = s["rss"], s["cache"], s["mapped_file"]
		m.Kernel = m.Current - m.Anon - m.File
	}
	return m, nil
}

// Remove removes the cgroup (once its processes exited).
func (c *MemCgroup) Remove() error { return os.Remove(c.Dir) }

// cgroupMounts maps "cgroup2" and each v1 controller to its mount point.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// … mount-point … - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		switch qf[0] {
		case "cgroup2":
			if _, ok := out["cgroup2"]; !ok {
				out["cgroup2"] = pf[4]
			}
		case "cgroup":
			for _, o := range strings.Split(qf[2], ",") {
				if _, ok := out[o]; !ok {
					out[o] = pf[4]
				}
			}
		}
	}
	return out, sc.Err()
}

// ownCgroups maps "" (v2) and each v1 controller to this process's cgroup
// path (/proc/self/cgroup).
func ownCgroups() map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[1] == "" {
			out[""] = f[2]
		}
		for _, c := range strings.Split(f[1], ",") {
			out[c] = f[2]
		}
	}
	return out
}

// enableMemoryV2 makes sure the children of the v2 cgroup dir get the
// memory controller.
func enableMemoryV2(dir string) error {
	if !hasWord(filepath.Join(dir, "cgroup.controllers"), "memory") {
		return fmt.Errorf("%s: the memory controller is not available", dir)
	}
	if hasWord(filepath.Join(dir, "cgroup.subtree_control"), "memory") {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0o644); err != nil {
		return fmt.Errorf("%s: enabling memory for its children: %w", dir, err)
	}
	return nil
}

func hasWord(path, w string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, f := range strings.Fields(string(b)) {
		if f == w {
			return true
		}
	}
	return false
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func uniq(a, b string) []string {
	if a == b {
		return []string{a}
	}
	return []string{a, b}
}

// DropPageCache writes back and drops path's pages from the page cache
// (posix_fadvise DONTNEED), so the next process to touch them faults them
// in from disk and its cgroup is charged for them, as for a service started
// at boot. Pages some process still maps stay; it returns the bytes of path
// resident before and after.
func DropPageCache(path string) (before, after int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	before, err = residentBytes(f)
	if err != nil {
		return 0, 0, err
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return before, 0, err
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return before, 0, err
	}
	after, err = residentBytes(f)
	return before, after, err
}

// ResidentBytes is how much of path is in the page cache (mincore).
func ResidentBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return residentBytes(f)
}

func residentBytes(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if fi.Size() == 0 {
		return 0, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, e
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n++
		}
	}
	return n * page, nil
}

// ReadaheadKB is the read-ahead window, in KiB, of the block device that
// holds path (its backing device's read_ahead_kb), or -1 where it cannot
// be found (tmpfs, overlay). A fault on a file mapping reads this much
// around the faulting page into the page cache, charged to the faulting
// process's cgroup: with a large window, a few scattered touches bring a
// whole binary in.
func ReadaheadKB(path string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return -1
	}
	maj, mnr := unix.Major(st.Dev), unix.Minor(st.Dev)
	for _, p := range []string{
		fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", maj, mnr),
		fmt.Sprintf("/sys/dev/block/%d:%d/queue/read_ahead_kb", maj, mnr),
		fmt.Sprintf("/sys/dev/block/%d:%d/../queue/read_ahead_kb", maj, mnr),
	} {
		if v, err := readInt(p); err == nil {
			return v
		}
	}
	return -1
}
