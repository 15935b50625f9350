package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"
)

// The trim comes once the engine has been idle for TrimAfterIdle, once per
// idle period; after it, the drop of the unmapped cache within
// faultCheckEvery of a major fault, and every dropAgainAfter anyway;
// neither while an event runs or after the agent stopped.
func TestTrimAfterIdle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)), clk)
	var trims, drops atomic.Int32
	tr.do = func() { trims.Add(1) }
	tr.again = func() { drops.Add(1) }
	var faults atomic.Int64
	tr.faults = func() int64 { return faults.Load() }
	// step moves the clock once the idle goroutine waits on it (or right
	// away when none should).
	step := func(d time.Duration, waiting bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for waiting && !clk.HasWaiters() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		clk.Step(d)
	}
	want := func(wt, wd int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for (trims.Load() != wt || drops.Load() != wd) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // and no more than that
		if gt, gd := trims.Load(), drops.Load(); gt != wt || gd != wd {
			t.Fatalf("%d trims and %d drops, want %d and %d", gt, gd, wt, wd)
		}
	}
	tr.state("starting")
	step(2*TrimAfterIdle, false)
	want(0, 0) // not idle yet: start-up work

	tr.state("idle")
	step(TrimAfterIdle-time.Second, true)
	want(0, 0)
	step(time.Second, true)
	want(1, 0)
	// ticks moves the clock n looks of faultCheckEvery.
	ticks := func(n int) {
		t.Helper()
		for range n {
			step(faultCheckEvery, true)
		}
	}
	// No fault: the next drop after dropAgainAfter.
	ticks(int(dropAgainAfter/faultCheckEvery) - 1)
	want(1, 0)
	ticks(1)
	want(1, 1)
	// A fault (new code run while idle: it read ahead): dropped at the
	// next look, not a minute later; then nothing while none comes.
	ticks(2)
	want(1, 1)
	faults.Add(1)
	ticks(1)
	want(1, 2)
	ticks(3)
	want(1, 2)
	faults.Add(3)
	ticks(1)
	want(1, 3) // the trim once per idle period, the drops as faults come

	tr.state("event e: step cordon") // an event before the minute is up
	tr.state("idle")
	step(TrimAfterIdle/2, true)
	tr.state("event f: step cordon")
	step(2*TrimAfterIdle, false)
	want(1, 3)
	tr.state("idle")
	step(TrimAfterIdle, true)
	want(2, 3)
	tr.state("event g: step cordon") // before the next drop
	faults.Add(1)
	step(dropAgainAfter, false)
	want(2, 3)

	tr.state("idle")
	step(time.Second, true)
	tr.stop() // the agent stops: nothing pending runs
	step(2*TrimAfterIdle, false)
	want(2, 3)
}

// TestMajorFaults: the count is read from /proc/self/stat (a number, and it
// rises when a page of a file dropped from the cache is touched), and a
// command name with spaces and parentheses does not shift the fields.
func TestMajorFaults(t *testing.T) {
	if got := parseMajflt("4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1234 0 77 0 5 6 0 0 20 0"); got != 77 {
		t.Errorf("majflt of a stat line with a tricky name: %d, want 77", got)
	}
	if got := parseMajflt("garbage"); got != -1 {
		t.Errorf("majflt of garbage: %d, want -1", got)
	}
	if n := majorFaults(); n < 0 {
		t.Fatalf("majorFaults() = %d: /proc/self/stat unreadable", n)
	}
	p := filepath.Join(diskDir(t), "majflt-test")
	t.Cleanup(func() { _ = os.Remove(p) })
	const size = 1 << 20
	if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m) //nolint:errcheck
	// A page just written may not be dropped at once (ext4 keeps its
	// buffers busy until the journal commits, later on a loaded disk: the
	// test failed once in make test): write back and drop until mincore
	// says no page is cached.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		n := cachedPages(t, m)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the file's %d pages still cached 20 s after write-back and DONTNEED", n, size/os.Getpagesize())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// One page read a fault (MADV_RANDOM holds on a mapping that is not
	// executable), so each touch below is a fault of its own: the kernel
	// does not count every one as major (one that is retried under the
	// mmap lock may not be; once in ten here with a single fault), but it
	// counts some.
	if err := unix.Madvise(m, unix.MADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	before := majorFaults()
	var sum byte
	for i := 0; i < len(m); i += os.Getpagesize() {
		sum += m[i]
	}
	if after := majorFaults(); after <= before {
		t.Errorf("major faults %d → %d after touching a dropped file's pages (sum %d)", before, after, sum)
	}
}

// cachedPages counts the pages of mapping m in the page cache (mincore):
// looking does not fault them in.
func cachedPages(t *testing.T, m []byte) int {
	t.Helper()
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// pageOutExecutable releases this (test) binary's read-only pages: the
// file-backed part of the resident set goes down to what is still used,
// on this kernel (Linux ≥ 5.4; CI's Debian 12 has 6.1).
func TestPageOutExecutable(t *testing.T) {
	// The test binary was just linked: its pages may still be dirty in the
	// page cache, and only clean ones can be dropped (an installed agent's
	// are clean). Write them back first.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before := rssFileKiB(t)
	n, err := pageOutExecutable()
	if err != nil {
		t.Fatalf("madvise(MADV_PAGEOUT) on the executable: %v (%d regions advised)", err, n)
	}
	if n < 2 {
		t.Fatalf("%d regions of the executable advised; want its code and read-only data", n)
	}
	after := rssFileKiB(t)
	// What stays: the few pages this test runs, the C library's.
	if after > 8<<10 {
		t.Fatalf("file-backed resident set %d KiB before, %d KiB after the page-out; want at most 8 MiB left of this %d MiB binary",
			before, after, exeMiB(t))
	}
	t.Logf("file-backed resident set: %d KiB → %d KiB", before, after)
}

func rssFileKiB(t *testing.T) int {
	t.Helper()
	n := statusKiB("RssFile")
	if n == 0 {
		t.Fatal("no RssFile in /proc/self/status")
	}
	return n
}

func exeMiB(t *testing.T) int64 {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size() >> 20
}

// diskDir is a directory on a disk-backed file system for a file whose
// pages must come back from the disk (a major fault): the test's temporary
// directory, or the package's own directory where that is tmpfs (Fedora's
// and Arch's /tmp, where DONTNEED drops nothing and a touch is a minor
// fault).
func diskDir(t *testing.T) string {
	t.Helper()
	for _, d := range []string{t.TempDir(), "."} {
		var fs unix.Statfs_t
		if err := unix.Statfs(d, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.RAMFS_MAGIC {
			return d
		}
	}
	t.Skip("SKIPPED: neither the temporary directory nor the package's directory is on a disk-backed file system; a major fault cannot be made")
	return ""
}
