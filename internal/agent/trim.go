package agent

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// TrimAfterIdle is how long the engine must have been idle before the
// agent releases the pages its start-up and its last event touched.
// After that, while still idle, it looks every faultCheckEvery at its
// count of major faults and drops the executable's unmapped page cache
// again when it rose (each new code fault reads ahead, below), and every
// dropAgainAfter in any case (read-ahead still in flight at a drop; and
// the kernel does not count every fault that reads a page as major:
// TestMajorFaults saw one in ten uncounted).
const (
	TrimAfterIdle   = time.Minute
	faultCheckEvery = 5 * time.Second
	dropAgainAfter  = time.Minute
)

// trimmer releases, once the agent has been idle for TrimAfterIdle, the
// memory an idle agent does not use (docs/benchmarks.md section 5):
//
//   - the pages of its own executable that are mapped read-only (code,
//     read-only data, the function tables), with madvise(MADV_PAGEOUT):
//     most of them were touched once, by the packages' init at start (the
//     client-go scheme registers every API group; kubectl's drain library
//     alone maps about 16 MiB of file pages) or by the last event's code.
//     They are clean: the kernel drops them, and systemd's accounting of
//     the service (memory.current) goes down with RSS;
//   - the executable's page cache that nothing maps (posix_fadvise
//     DONTNEED): what the device's read-ahead brought in around the pages
//     that were touched (8 MiB around each fault on some virtual disks);
//   - the heap the garbage collector has freed (debug.FreeOSMemory).
//
// From then on the executable's mappings are MADV_RANDOM: a fault reads
// its page, not a read-ahead window. Some kernels ignore that on
// executable mappings (Linux 6.18 does: one fault on the agent's code
// reads 5-7 MiB ahead, docs/bench/2026-12-07-exec-readahead), and the
// idle agent still faults in code now and then (a watch restart's path):
// so while idle it drops the unmapped cache again within faultCheckEvery
// of a major fault (a fadvise call, no reads). With a drop a minute
// alone, the idle code faulting back in right after the trim, and later a
// watch restart's faults, left 6-18 MiB of read-ahead charged to the
// service for up to a minute each: in the benchmark's 10-minute window the
// cgroup was above 30 MiB for about 94 s, 36 s with this, about 30 s of
// both before the trim (docs/bench/2026-12-07-idle-ab). What the idle loop runs faults back in at
// once; an event's code comes back from the file when the next event runs:
// the first claim after a trim is slower (benchmarks section 5 has the
// figure), the next ones are not.
//
// The trim comes once per idle period: it starts when the engine says
// "idle" and is cancelled by any other state. Nothing is trimmed before the first
// idle (start-up work in progress) or while an event runs. A kernel
// without MADV_PAGEOUT (before 5.4) refuses it; the agent logs that at
// debug level and goes on.
type trimmer struct {
	log    *slog.Logger
	clock  clock.Clock
	do     func()       // the trim (tests replace it)
	again  func()       // a later drop of the unmapped cache (tests replace it)
	faults func() int64 // the process's major faults so far (tests replace it)
	mu     sync.Mutex
	cancel chan struct{}
}

func newTrimmer(log *slog.Logger, clk clock.Clock) *trimmer {
	t := &trimmer{log: log, clock: clk, faults: majorFaults}
	t.do, t.again = t.trim, t.dropAgain
	return t
}

// state is fed the engine's state line (engine.Config.Notify).
func (t *trimmer) state(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cancel != nil {
		close(t.cancel)
		t.cancel = nil
	}
	if s != "idle" {
		return
	}
	cancel := make(chan struct{})
	t.cancel = cancel
	go t.idle(cancel)
}

// idle runs one idle period's trim, then looks every faultCheckEvery and
// drops the unmapped cache when major faults came since the last drop or
// dropAgainAfter has passed, until cancel closes.
func (t *trimmer) idle(cancel <-chan struct{}) {
	after, trimmed := TrimAfterIdle, false
	var last int64
	var since time.Duration
	for {
		tm := t.clock.NewTimer(after)
		select {
		case <-cancel:
			tm.Stop() // no timer is left behind by a cancelled period
			return
		case <-tm.C():
		}
		select {
		case <-cancel: // an event began as the timer fired
			return
		default:
		}
		if !trimmed {
			t.do()
			trimmed, after, last = true, faultCheckEvery, t.faults()
			continue
		}
		since += faultCheckEvery
		if n := t.faults(); n != last || since >= dropAgainAfter {
			t.again()
			last, since = n, 0
		}
	}
}

// stop cancels a pending trim (the agent is stopping).
func (t *trimmer) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cancel != nil {
		close(t.cancel)
		t.cancel = nil
	}
}

func (t *trimmer) trim() {
	before := residentKiB()
	debug.FreeOSMemory()
	n, err := pageOutExecutable()
	if err != nil {
		t.log.Debug("releasing the executable's idle pages failed", "err", err)
	}
	t.log.Debug("idle: released memory", "rssKiBBefore", before, "rssKiBAfter", residentKiB(), "regions", n)
}

func (t *trimmer) dropAgain() {
	if err := dropExecutableCache(); err != nil {
		t.log.Debug("dropping the executable's unmapped page cache failed", "err", err)
	}
}

// dropExecutableCache drops the executable's clean page-cache pages that
// no process maps (POSIX_FADV_DONTNEED): what read-ahead brought in around
// the pages that were touched, and the pages MADV_PAGEOUT just unmapped.
func dropExecutableCache() error {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// pageOutExecutable asks the kernel to reclaim the read-only mappings of
// this process's executable (found by the mapping that holds this
// function's code, so a binary replaced on disk by an upgrade is still
// found). It returns how many regions it advised.
func pageOutExecutable() (int, error) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	type region struct {
		start, end uintptr
		perms, id  string
	}
	var regions []region
	var own string
	pc := reflect.ValueOf(pageOutExecutable).Pointer()
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[4] == "0" {
			continue
		}
		se := strings.SplitN(f[0], "-", 2)
		start, err1 := strconv.ParseUint(se[0], 16, 64)
		end, err2 := strconv.ParseUint(se[1], 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		r := region{start: uintptr(start), end: uintptr(end), perms: f[1], id: f[3] + " " + f[4]}
		if pc >= r.start && pc < r.end {
			own = r.id
		}
		regions = append(regions, r)
	}
	n := 0
	var first error
	for _, r := range regions {
		if r.id != own || strings.Contains(r.perms, "w") {
			continue // other files; writable (private copies) are anonymous memory
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_PAGEOUT); e != 0 {
			if first == nil {
				first = e
			}
			continue
		}
		// Meant to make a later fault read the page it needs, not the
		// device's read-ahead window around it (8 MiB on some virtual
		// disks); some kernels ignore it on executable mappings (Linux
		// 6.18 does), hence the drops after major faults (idle).
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_RANDOM)
		n++
	}
	if err := dropExecutableCache(); err != nil && first == nil {
		first = err
	}
	return n, first
}

// majorFaults is this process's count of major faults (/proc/self/stat
// majflt), -1 if unknown.
func majorFaults() int64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	return parseMajflt(string(b))
}

// parseMajflt reads majflt, field 12 of a /proc/<pid>/stat line; the
// command name (field 2, in parentheses) may hold spaces and parentheses.
func parseMajflt(stat string) int64 {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(stat[i+1:]) // from field 3 (state) on
	if len(f) < 10 {
		return -1
	}
	n, err := strconv.ParseInt(f[9], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// residentKiB is this process's resident set (VmRSS), 0 if unknown.
func residentKiB() int { return statusKiB("VmRSS") }

// statusKiB is a "<field>: N kB" line of /proc/self/status, 0 if unknown.
func statusKiB(field string) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
