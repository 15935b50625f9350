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

// trimAfterIdle is how long the engine must have been idle before the
// agent releases the pages its start-up and its last event touched;
// every dropAgainAfter while still idle it drops again what read-ahead
// brought back meanwhile.
const (
	trimAfterIdle = time.Minute
	// A minute (it was 4): read-ahead brings unmapped pages back while
	// idle (the watch's restarts and bookmarks fault in code nothing else
	// runs). Measured, it did not lower the idle figure (31.7 MiB at 4
	// minutes, 31.6 at 1; a drop within 5 s of each major fault, tried
	// and reverted, 31.5): what stays charged is cache the drop does not
	// release, for a reason not established (docs/benchmarks.md section
	// 5). Kept: one fadvise call a minute.
	dropAgainAfter = time.Minute
)

// trimmer releases, once the agent has been idle for trimAfterIdle, the
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
// From then on the executable's mappings are MADV_RANDOM, meant to make a
// fault read its page, not a read-ahead window; on executable mappings
// some kernels ignore it (Linux 6.18 does: one fault reads 5-7 MiB ahead,
// docs/bench/2026-12-07-exec-readahead), so every dropAgainAfter while
// still idle the unmapped cache is dropped again: a fadvise call, no reads. What the idle loop runs faults back in at
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
	do     func() // the trim (tests replace it)
	again  func() // the second drop of the unmapped cache (tests replace it)
	mu     sync.Mutex
	cancel chan struct{}
}

func newTrimmer(log *slog.Logger, clk clock.Clock) *trimmer {
	t := &trimmer{log: log, clock: clk}
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

// idle runs one idle period's trim, then the drop of the unmapped cache
// every dropAgainAfter, until cancel closes.
func (t *trimmer) idle(cancel <-chan struct{}) {
	run, after := t.do, trimAfterIdle
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
		run()
		run, after = t.again, dropAgainAfter
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
		// Meant to make a fault read the page it needs, not the device's
		// read-ahead window around it (8 MiB on some virtual disks): the
		// idle loop's few pages would otherwise bring tens of MiB back.
		// Some kernels ignore it on executable mappings (Linux 6.18).
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_RANDOM)
		n++
	}
	if err := dropExecutableCache(); err != nil && first == nil {
		first = err
	}
	return n, first
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
