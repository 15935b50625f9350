package agent

import (
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The trim comes once the engine has been idle for trimAfterIdle, once per
// idle period; the drop of the unmapped cache every dropAgainAfter after
// it; neither while an event runs or after the agent stopped.
func TestTrimAfterIdle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)), clk)
	var trims, drops atomic.Int32
	tr.do = func() { trims.Add(1) }
	tr.again = func() { drops.Add(1) }
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
	step(2*trimAfterIdle, false)
	want(0, 0) // not idle yet: start-up work

	tr.state("idle")
	step(trimAfterIdle-time.Second, true)
	want(0, 0)
	step(time.Second, true)
	want(1, 0)
	// The unmapped cache is dropped again every minute (dropAgainAfter).
	step(time.Minute, true)
	want(1, 1)
	step(dropAgainAfter, true)
	want(1, 2) // the trim once per idle period, the drop every dropAgainAfter

	tr.state("event e: step cordon") // an event before the minute is up
	tr.state("idle")
	step(trimAfterIdle/2, true)
	tr.state("event f: step cordon")
	step(2*trimAfterIdle, false)
	want(1, 2)
	tr.state("idle")
	step(trimAfterIdle, true)
	want(2, 2)
	tr.state("event g: step cordon") // before the next drop
	step(dropAgainAfter, false)
	want(2, 2)

	tr.state("idle")
	step(time.Second, true)
	tr.stop() // the agent stops: nothing pending runs
	step(2*trimAfterIdle, false)
	want(2, 2)
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
