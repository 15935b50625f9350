package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recordMarker appears in the JSON of every event written by fillJournal, so
// a test can find the leaf pages that hold records.
const recordMarker = "RECORD-MARKER"

// fillJournal writes n events with step logs, big enough that the file spans
// many pages, and closes the journal.
func fillJournal(t *testing.T, path string, n int) {
	t.Helper()
	j, _, err := Open(context.Background(), path, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		uid := fmt.Sprintf("uid-%03d", i)
		ev := testEvent(uid)
		ev.Object = json.RawMessage(fmt.Sprintf(`{"marker":%q,"pad":%q}`, recordMarker, strings.Repeat("x", 1500)))
		mustPutEvent(t, j, ev)
		mustAppend(t, j, uid, StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

const pageSize = 4096 // bbolt uses the OS page size; checked in pageOf

// leafPageWith returns the offset of the first leaf page that contains needle.
func leafPageWith(t *testing.T, data []byte, needle string) int {
	t.Helper()
	if os.Getpagesize() != pageSize {
		t.Skipf("page size %d", os.Getpagesize())
	}
	const leafPageFlag = 0x02 // bbolt internal/common: page header is id u64, flags u16, count u16, overflow u32
	for off := 2 * pageSize; off+pageSize <= len(data); off += pageSize {
		page := data[off : off+pageSize]
		if binary.LittleEndian.Uint16(page[8:10])&leafPageFlag != 0 && bytes.Contains(page, []byte(needle)) {
			return off
		}
	}
	t.Fatalf("no leaf page holds %q", needle)
	return 0
}

type corruption struct {
	name    string
	corrupt func(t *testing.T, data []byte) []byte
}

var corruptions = []corruption{
	{
		name: "garbage file",
		corrupt: func(t *testing.T, data []byte) []byte {
			g := make([]byte, 64<<10)
			r := rand.NewChaCha8([32]byte{1})
			_, _ = r.Read(g)
			return g
		},
	},
	{
		name: "both meta pages overwritten",
		corrupt: func(t *testing.T, data []byte) []byte {
			copy(data[0:], bytes.Repeat([]byte{0xAB}, pageSize))
			copy(data[pageSize:], bytes.Repeat([]byte{0xCD}, pageSize))
			return data
		},
	},
	{
		name: "truncated below two pages",
		corrupt: func(t *testing.T, data []byte) []byte {
			return data[:5000]
		},
	},
	{
		name: "truncated in the middle",
		corrupt: func(t *testing.T, data []byte) []byte {
			return data[:3*pageSize]
		},
	},
	{
		// A whole leaf page of garbage: bbolt's tx.Check panics in a
		// goroutine ("page expected to be ..."), which would kill an
		// in-process checker.
		name: "leaf page holding records overwritten",
		corrupt: func(t *testing.T, data []byte) []byte {
			off := leafPageWith(t, data, recordMarker)
			r := rand.NewChaCha8([32]byte{2})
			_, _ = r.Read(data[off : off+pageSize])
			return data
		},
	},
	{
		// The page structure is intact but a record no longer decodes:
		// tx.Check passes and the record check catches it.
		name: "record bytes scribbled inside a leaf page",
		corrupt: func(t *testing.T, data []byte) []byte {
			off := leafPageWith(t, data, recordMarker)
			i := bytes.Index(data[off:off+pageSize], []byte(recordMarker))
			copy(data[off+i-2:], "\x00{{\xff")
			return data
		},
	},
}

func TestCorruptFileMovedAside(t *testing.T) {
	for _, tt := range corruptions {
		t.Run(tt.name, func(t *testing.T) {
			path := journalPath(t)
			fillJournal(t, path, 12)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			bad := tt.corrupt(t, data)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			badSum := fileSum(t, path)

			j, rep := openJournal(t, path, testOptions(t))

			if rep.Corruption == nil {
				t.Fatalf("report = %+v, want a corruption", rep)
			}
			wantMoved := path + corruptSuffix
			if rep.Corruption.MovedTo != wantMoved || rep.Corruption.Path != path {
				t.Errorf("corruption = %+v, want moved to %s", rep.Corruption, wantMoved)
			}
			if !errors.Is(rep.Corruption.Err, ErrCorrupt) {
				t.Errorf("corruption error %v does not wrap ErrCorrupt", rep.Corruption.Err)
			}
			wantErrContains(t, rep.Corruption.Err, path)
			if s := rep.Corruption.String(); !strings.Contains(s, path) || !strings.Contains(s, wantMoved) {
				t.Errorf("report line %q names neither path", s)
			}
			t.Logf("reported: %s", rep.Corruption)
			if got := fileSum(t, wantMoved); got != badSum {
				t.Errorf("the moved-aside file differs from the corrupt one")
			}
			if c := corruptFiles(t, path); len(c) != 1 {
				t.Errorf("corrupt files = %v, want exactly one", c)
			}

			// A fresh, empty, usable journal took its place.
			if !rep.Created || rep.FoundSchema != 0 {
				t.Errorf("report = %+v, want a created file", rep)
			}
			if evs, err := j.Events(); err != nil || len(evs) != 0 {
				t.Errorf("Events() = %v, %v; want none", evs, err)
			}
			mustPutEvent(t, j, testEvent("uid-new"))
			mustAppend(t, j, "uid-new", StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			if err := CheckFile(path, DefaultLockTimeout); err != nil {
				t.Errorf("CheckFile of the fresh journal: %v", err)
			}
		})
	}
}

func TestCorruptFileNameTaken(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	for i, want := range []string{path + corruptSuffix, path + corruptSuffix + "-2"} {
		if err := os.WriteFile(path, []byte(strings.Repeat("garbage", 2000)), 0o600); err != nil {
			t.Fatal(err)
		}
		j, rep, err := Open(context.Background(), path, opts)
		if err != nil {
			t.Fatal(err)
		}
		_ = j.Close()
		if rep.Corruption == nil || rep.Corruption.MovedTo != want {
			t.Errorf("round %d: report %+v, want moved to %s", i, rep.Corruption, want)
		}
	}
}

// One bad meta page is not corruption: bbolt keeps two, reads the valid one,
// and its next commit rewrites the bad one. A bad newer meta page loses the
// last commit, which is what a torn meta write means.
func TestOneMetaPageCorrupt(t *testing.T) {
	tests := []struct {
		name      string
		newer     bool
		wantSteps int // of the last event, whose step was the last commit
	}{
		{name: "older meta page", newer: false, wantSteps: 1},
		{name: "newer meta page", newer: true, wantSteps: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := journalPath(t)
			fillJournal(t, path, 3)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			txid := func(off int) uint64 { return binary.LittleEndian.Uint64(data[off+64:]) } // meta.txid
			newer := 0
			if txid(pageSize) > txid(0) {
				newer = pageSize
			}
			off := pageSize - newer // the older one
			if tt.newer {
				off = newer
			}
			copy(data[off:], bytes.Repeat([]byte{0xEE}, pageSize))
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, ok := singleGoodMeta(path); !ok {
				t.Fatal("singleGoodMeta does not see the bad page")
			}

			j, rep := openJournal(t, path, testOptions(t))
			if rep.Corruption != nil || rep.Created {
				t.Fatalf("report = %+v, want the file kept", rep)
			}
			if evs, err := j.Events(); err != nil || len(evs) != 3 {
				t.Errorf("Events() = %d records, %v; want 3", len(evs), err)
			}
			if steps, err := j.Steps("uid-002"); err != nil || len(steps) != tt.wantSteps {
				t.Errorf("Steps(uid-002) = %d records, %v; want %d", len(steps), err, tt.wantSteps)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			// Open committed, which rewrote the bad meta page.
			if _, _, ok := singleGoodMeta(path); ok {
				t.Error("the bad meta page is still there after a commit")
			}
			if err := CheckFile(path, time.Second); err != nil {
				t.Errorf("CheckFile after the repair: %v", err)
			}
		})
	}
}

// A check that cannot run is not corruption: Open fails and the file stays.
func TestBrokenCheckerFailsClosed(t *testing.T) {
	tests := []struct {
		name    string
		command []string
	}{
		{name: "missing command", command: []string{"/nonexistent/lifecycle-agent", "journal", "check-file"}},
		{name: "command without the check", command: []string{"/bin/true"}},
		{name: "usage error", command: []string{"/bin/sh", "-c", "echo 'unknown command' >&2; exit 2", "sh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := journalPath(t)
			fillJournal(t, path, 1)
			sum := fileSum(t, path)
			opts := testOptions(t)
			opts.CheckCommand = tt.command
			_, _, err := Open(context.Background(), path, opts)
			if err == nil || errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want a non-corruption error", err)
			}
			wantErrContains(t, err, path)
			if fileSum(t, path) != sum || len(corruptFiles(t, path)) != 0 {
				t.Errorf("the file was touched or moved")
			}
		})
	}
}

// An in-process check of a healthy or a plainly invalid file is safe.
func TestCheckFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	fillJournal(t, good, 2)
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("junk"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		wantErr error
	}{
		{name: "healthy", path: good},
		{name: "garbage", path: garbage, wantErr: ErrCorrupt},
		{name: "missing", path: filepath.Join(dir, "missing.db"), wantErr: os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFile(tt.path, DefaultLockTimeout)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("CheckFile = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				wantErrContains(t, err, tt.path)
			}
		})
	}
}
