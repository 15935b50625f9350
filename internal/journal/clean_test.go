package journal

import (
	"context"
	"errors"
	"os"
	"testing"
)

// countingChecker wraps the real check subprocess and counts its runs.
func countingChecker(t *testing.T, opts *Options) *int {
	t.Helper()
	n := new(int)
	real := CommandChecker(opts.CheckCommand, opts.LockTimeout, opts.CheckTimeout)
	opts.Checker = func(ctx context.Context, path string) error {
		*n++
		return real(ctx, path)
	}
	opts.TrustCleanClose = true
	return n
}

func TestCleanCloseSkipsTheCheck(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	checks := countingChecker(t, &opts)

	j, rep := openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-a"))
	if rep.CleanClose {
		t.Errorf("a new journal reported a clean close")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".clean"); err != nil {
		t.Fatalf("Close left no marker: %v", err)
	}

	j, rep = openJournal(t, path, opts)
	if !rep.CleanClose || *checks != 0 {
		t.Errorf("after a clean close: CleanClose=%v, %d checks; want true, 0", rep.CleanClose, *checks)
	}
	if _, err := os.Stat(path + ".clean"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the marker is still there while the journal is open (err=%v)", err)
	}
	if evs, err := j.Events(); err != nil || len(evs) != 1 || evs[0].UID != "uid-a" {
		t.Errorf("events after reopening = %+v, %v", evs, err)
	}
	_ = j.Close()
}

// A journal never closed (a crash or a power cut: the process holding it
// just ends) has no marker, so it is checked.
func TestNoCloseMeansCheck(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	checks := countingChecker(t, &opts)
	j, _ := openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-a"))
	_ = j.Close()
	// The next agent opens it (marker consumed) and dies without Close.
	j, _ = openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-b"))
	_ = j.db.Close() // the file is released, as by the kernel at exit; no marker
	_, rep := openJournal(t, path, opts)
	if rep.CleanClose || *checks != 1 {
		t.Errorf("after a crash: CleanClose=%v, %d checks; want false, 1", rep.CleanClose, *checks)
	}
}

// A file changed after its clean close (here: scribbled, the same size) is
// checked, found corrupt and moved aside, as without the marker.
func TestChangedAfterCleanCloseIsChecked(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	checks := countingChecker(t, &opts)
	j, _ := openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-a"))
	_ = j.Close()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = 0xA5
	}
	if _, err := f.WriteAt(garbage, 0); err != nil { // both meta pages' first one
		t.Fatal(err)
	}
	if _, err := f.WriteAt(garbage, 4096); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	j, rep := openJournal(t, path, opts)
	if rep.CleanClose || *checks != 1 || rep.Corruption == nil {
		t.Errorf("after a change: CleanClose=%v, %d checks, corruption %v; want false, 1, moved aside", rep.CleanClose, *checks, rep.Corruption)
	}
}

// Without TrustCleanClose (the journal tools, the tests) every open checks.
func TestCleanCloseIgnoredUnlessTrusted(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	checks := countingChecker(t, &opts)
	opts.TrustCleanClose = false
	j, _ := openJournal(t, path, opts)
	_ = j.Close()
	j, rep := openJournal(t, path, opts)
	if rep.CleanClose || *checks != 1 {
		t.Errorf("CleanClose=%v, %d checks; want false, 1", rep.CleanClose, *checks)
	}
}
