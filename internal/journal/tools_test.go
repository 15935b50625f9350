package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// populate writes a journal with something in every bucket and closes it:
// two unfinished events (3 steps), two outbox entries, one owned change and
// one finished event.
func populate(t *testing.T, path string) {
	t.Helper()
	j, _, err := Open(context.Background(), path, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"uid-a", "uid-b", "uid-done"} {
		mustPutEvent(t, j, testEvent(uid))
	}
	mustAppend(t, j, "uid-a", StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
	mustAppend(t, j, "uid-a", StepRecord{Step: "cordon", Phase: PhaseDone, State: StepDone, Attempt: 1})
	mustAppend(t, j, "uid-b", StepRecord{Step: "reboot", Phase: PhaseIntent, State: StepRunning, Attempt: 2, BootID: "b1"})
	mustAppend(t, j, "uid-done", StepRecord{Step: "uncordon", Phase: PhaseDone, State: StepDone, Attempt: 1})
	if err := j.FinishEvent("uid-done", OutcomeSucceeded, "ok"); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"uid-a", "uid-b"} {
		if _, err := j.OutboxPush(OutboxEntry{UID: uid, Kind: OutboxEventStatus, Payload: json.RawMessage(`{"claimStatus":"Claimed"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.AddOwned(Change{Kind: ChangeCordon, Node: "node-a", EventUID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	path := journalPath(t)
	populate(t, path)
	sum := fileSum(t, path)

	s, err := Verify(context.Background(), path, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{Path: path, SizeBytes: s.SizeBytes, SchemaVersion: SchemaVersion, Events: 2, Steps: 3, Outbox: 2, Owned: 1, History: 1}
	if s != want || s.SizeBytes == 0 {
		t.Errorf("Verify = %+v, want %+v", s, want)
	}
	if fileSum(t, path) != sum {
		t.Error("Verify changed the file")
	}
}

func TestVerifyCorruptAndLocked(t *testing.T) {
	path := journalPath(t)
	populate(t, path)
	data, _ := os.ReadFile(path)
	copy(data[0:], bytes.Repeat([]byte{1}, 2*pageSize))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Verify(context.Background(), path, testOptions(t))
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify(corrupt) = %v, want ErrCorrupt", err)
	}
	wantErrContains(t, err, path)
	if c := corruptFiles(t, path); len(c) != 0 {
		t.Errorf("Verify moved the file: %v", c)
	}

	path2 := journalPath(t)
	opts := testOptions(t)
	opts.LockTimeout = 200 * time.Millisecond
	openJournal(t, path2, opts)
	if _, err := Verify(context.Background(), path2, opts); !errors.Is(err, ErrLocked) {
		t.Errorf("Verify(held by an agent) = %v, want ErrLocked", err)
	}
	if _, err := Compact(context.Background(), path2, opts); !errors.Is(err, ErrLocked) {
		t.Errorf("Compact(held by an agent) = %v, want ErrLocked", err)
	}
}

func TestExport(t *testing.T) {
	path := journalPath(t)
	populate(t, path)
	var buf bytes.Buffer
	if err := Export(path, &buf); err != nil {
		t.Fatal(err)
	}
	var doc ExportDoc
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("export is not JSON: %v\n%s", err, buf.String())
	}
	if doc.Path != path || doc.SchemaVersion != SchemaVersion || len(doc.Events) != 2 || len(doc.Outbox) != 2 || len(doc.Owned) != 1 || len(doc.History) != 1 {
		t.Fatalf("export = %+v", doc)
	}
	a := doc.Events[0]
	if a.UID != "uid-a" || len(a.Steps) != 2 || a.Steps[1].Phase != PhaseDone || !json.Valid(a.Object) {
		t.Errorf("exported event = %+v", a)
	}
	if doc.History[0].Event.UID != "uid-done" || len(doc.History[0].Steps) != 1 {
		t.Errorf("exported history = %+v", doc.History)
	}
	// Enums are exported as the numbers stored.
	if !strings.Contains(buf.String(), `"phase": 2`) {
		t.Errorf("export does not show stored numbers:\n%s", buf.String())
	}
}

func TestCompact(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	opts.HistoryCap = 2
	j, _ := openJournal(t, path, opts)
	// Many big records, live at once, then dropped: the file grows and
	// keeps its size until compacted.
	const n = 60
	pad := strings.Repeat("p", 6000)
	var lastSeq uint64
	for i := range n {
		uid := fmt.Sprintf("uid-%03d", i)
		ev := testEvent(uid)
		ev.Object = json.RawMessage(fmt.Sprintf(`{"pad":%q}`, pad))
		mustPutEvent(t, j, ev)
		mustAppend(t, j, uid, StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
		seq, err := j.OutboxPush(OutboxEntry{UID: uid, Kind: OutboxEventStatus, Payload: json.RawMessage(`{"claimStatus":"Claimed"}`)})
		if err != nil {
			t.Fatal(err)
		}
		lastSeq = seq
	}
	for i := range n - 1 {
		uid := fmt.Sprintf("uid-%03d", i)
		if err := j.FinishEvent(uid, OutcomeSucceeded, ""); err != nil {
			t.Fatal(err)
		}
		if err := j.OutboxAck(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	last := fmt.Sprintf("uid-%03d", n-1)
	mustAppend(t, j, last, StepRecord{Step: "cordon", Phase: PhaseDone, State: StepDone, Attempt: 1})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	res, err := Compact(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted %d → %d bytes", res.BeforeBytes, res.AfterBytes)
	if fi, _ := os.Stat(path); res.AfterBytes >= res.BeforeBytes || fi.Size() != res.AfterBytes || res.Path != path {
		t.Errorf("Compact = %+v (file now %d bytes), want it smaller", res, fi.Size())
	}
	if _, err := os.Stat(path + ".compact-tmp"); !os.IsNotExist(err) {
		t.Errorf("temp file left behind: %v", err)
	}

	// The content survived, and sequences continue where they were.
	j, rep := openJournal(t, path, opts)
	if rep.Corruption != nil || rep.Created {
		t.Fatalf("report after compaction = %+v", rep)
	}
	if evs, _ := j.Events(); len(evs) != 1 || evs[0].UID != last {
		t.Errorf("events after compaction = %+v", evs)
	}
	if h, _ := j.History(); len(h) != 2 || h[1].Event.UID != fmt.Sprintf("uid-%03d", n-2) {
		t.Errorf("history after compaction = %d records", len(h))
	}
	if p, _ := j.OutboxPending(); len(p) != 1 || p[0].Seq != lastSeq {
		t.Errorf("outbox after compaction = %+v", p)
	}
	seq, err := j.OutboxPush(OutboxEntry{UID: last, Kind: OutboxEventStatus, Payload: json.RawMessage(`{}`)})
	if err != nil || seq != lastSeq+1 {
		t.Errorf("outbox seq after compaction = %d, %v; want %d", seq, err, lastSeq+1)
	}
	if s := mustAppend(t, j, last, StepRecord{Step: "wait", Phase: PhaseIntent, State: StepRunning, Attempt: 1}); s != 3 {
		t.Errorf("step seq after compaction = %d, want 3", s)
	}
}
