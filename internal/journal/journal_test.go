package journal

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
	"time"
)

func TestOpenCreatesEmptyJournal(t *testing.T) {
	path := journalPath(t)
	j, rep := openJournal(t, path, testOptions(t))

	if !rep.Created || rep.FoundSchema != 0 || rep.SchemaVersion != SchemaVersion || rep.Corruption != nil || len(rep.Migrations) != 0 {
		t.Errorf("report = %+v, want a created file at schema %d", rep, SchemaVersion)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	evs, err := j.Events()
	if err != nil || len(evs) != 0 {
		t.Errorf("Events() = %v, %v; want none", evs, err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if v, err := peekSchema(path, time.Second); err != nil || v != SchemaVersion {
		t.Errorf("schema on disk = %d, %v; want %d", v, err, SchemaVersion)
	}
}

func TestOpenMissingDirectory(t *testing.T) {
	path := t.TempDir() + "/nope/journal.db"
	_, _, err := Open(context.Background(), path, testOptions(t))
	wantErrContains(t, err, path)
}

func TestOpenExistingNeedsChecker(t *testing.T) {
	path := journalPath(t)
	j, _ := openJournal(t, path, testOptions(t))
	_ = j.Close()
	opts := testOptions(t)
	opts.CheckCommand = nil
	_, _, err := Open(context.Background(), path, opts)
	wantErrContains(t, err, path, "Checker")
}

func TestEventSnapshot(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	a, b := testEvent("uid-a"), testEvent("uid-b")
	b.Attrs = map[string]string{"disruptionLease": "rack-12-1"}
	mustPutEvent(t, j, b)
	mustPutEvent(t, j, a)

	got, ok, err := j.Event("uid-b")
	if err != nil || !ok {
		t.Fatalf("Event(uid-b) = %v, %v", ok, err)
	}
	if got.V != RecordVersion || got.Name != "ev-uid-b" || got.Driver != b.Driver || got.ResourceVersion != "42" ||
		got.State != EventClaimed || got.Attrs["disruptionLease"] != "rack-12-1" || !got.Updated.Equal(testTime) {
		t.Errorf("Event(uid-b) = %+v", got)
	}
	if !json.Valid(got.Object) || string(got.Object) != string(b.Object) {
		t.Errorf("object = %s, want %s", got.Object, b.Object)
	}

	a.State, a.ResourceVersion = EventRunning, "43"
	mustPutEvent(t, j, a)
	evs, err := j.Events()
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].UID != "uid-a" || evs[0].State != EventRunning || evs[0].ResourceVersion != "43" || evs[1].UID != "uid-b" {
		t.Errorf("Events() = %+v", evs)
	}
	if _, ok, err := j.Event("nope"); ok || err != nil {
		t.Errorf("Event(nope) = %v, %v; want not found", ok, err)
	}
}

func TestPutEventRejectsInvalid(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	tests := []struct {
		name string
		rec  EventRecord
	}{
		{name: "empty uid", rec: EventRecord{State: EventClaimed}},
		{name: "state zero", rec: EventRecord{UID: "u"}},
		{name: "state out of range", rec: EventRecord{UID: "u", State: 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := j.PutEvent(tt.rec); !errors.Is(err, errInvalidRecord) {
				t.Errorf("PutEvent = %v, want an invalid-record error", err)
			}
		})
	}
	if evs, _ := j.Events(); len(evs) != 0 {
		t.Errorf("stored %v", evs)
	}
}

func TestStepLog(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	j, _ := openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-a"))

	if _, ok, err := j.LastStep("uid-a"); ok || err != nil {
		t.Errorf("LastStep before any step = %v, %v", ok, err)
	}
	recs := []StepRecord{
		{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1, BootID: "boot-1"},
		{Step: "cordon", Phase: PhaseDone, State: StepDone, Attempt: 1, BootID: "boot-1", Message: "cordoned node-a"},
		{Step: "reboot", Phase: PhaseIntent, State: StepRunning, Attempt: 1, BootID: "boot-1"},
	}
	for i, r := range recs {
		if seq := mustAppend(t, j, "uid-a", r); seq != uint64(i+1) {
			t.Errorf("seq of record %d = %d, want %d", i, seq, i+1)
		}
	}
	if _, err := j.AppendStep("unknown", recs[0]); !errors.Is(err, ErrUnknownEvent) {
		t.Errorf("AppendStep(unknown) = %v, want ErrUnknownEvent", err)
	}
	if _, err := j.AppendStep("uid-a", StepRecord{Step: "x", Phase: 7, State: StepRunning}); !errors.Is(err, errInvalidRecord) {
		t.Errorf("AppendStep(bad phase) = %v, want an invalid-record error", err)
	}

	// The log survives a restart (and the subprocess check of the file).
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, rep := openJournal(t, path, opts)
	if rep.Created || rep.Corruption != nil || rep.FoundSchema != SchemaVersion {
		t.Errorf("reopen report = %+v", rep)
	}
	got, err := j.Steps("uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("Steps = %+v, want %d records", got, len(recs))
	}
	for i, r := range got {
		want := recs[i]
		if r.V != RecordVersion || r.Seq != uint64(i+1) || r.Step != want.Step || r.Phase != want.Phase || r.State != want.State ||
			r.Attempt != want.Attempt || r.BootID != want.BootID || r.Message != want.Message || !r.At.Equal(testTime) {
			t.Errorf("step %d = %+v, want %+v", i, r, want)
		}
	}
	last, ok, err := j.LastStep("uid-a")
	if err != nil || !ok || last.Seq != 3 || last.Step != "reboot" || last.Phase != PhaseIntent {
		t.Errorf("LastStep = %+v, %v, %v; want the reboot intent", last, ok, err)
	}
	if s, err := j.Steps("uid-b"); err != nil || len(s) != 0 {
		t.Errorf("Steps(uid-b) = %v, %v", s, err)
	}
}

func TestFinishEventHistoryCap(t *testing.T) {
	tests := []struct {
		name     string
		cap      int
		finish   int
		wantUIDs []string
	}{
		{name: "cap 1 keeps the newest", cap: 1, finish: 4, wantUIDs: []string{"e3"}},
		{name: "cap 2 drops the oldest", cap: 2, finish: 4, wantUIDs: []string{"e2", "e3"}},
		{name: "default cap keeps all", cap: 0, finish: 4, wantUIDs: []string{"e0", "e1", "e2", "e3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions(t)
			opts.HistoryCap = tt.cap
			j, _ := openJournal(t, journalPath(t), opts)
			for i := range tt.finish {
				uid := "e" + string(rune('0'+i))
				mustPutEvent(t, j, testEvent(uid))
				mustAppend(t, j, uid, StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
				mustAppend(t, j, uid, StepRecord{Step: "cordon", Phase: PhaseDone, State: StepDone, Attempt: 1})
				if err := j.FinishEvent(uid, OutcomeSucceeded, "drained"); err != nil {
					t.Fatal(err)
				}
				if s, _ := j.Steps(uid); len(s) != 0 {
					t.Errorf("steps of %s kept after finish: %v", uid, s)
				}
			}
			hist, err := j.History()
			if err != nil {
				t.Fatal(err)
			}
			var uids []string
			for _, h := range hist {
				uids = append(uids, h.Event.UID)
				if h.Outcome != OutcomeSucceeded || h.Message != "drained" || len(h.Steps) != 2 || !h.Finished.Equal(testTime) {
					t.Errorf("history record %+v", h)
				}
			}
			if !slices.Equal(uids, tt.wantUIDs) {
				t.Errorf("history = %v, want %v", uids, tt.wantUIDs)
			}
			if evs, _ := j.Events(); len(evs) != 0 {
				t.Errorf("unfinished events left: %v", evs)
			}
		})
	}
}

func TestFinishUnknownEvent(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	if err := j.FinishEvent("nope", OutcomeFailed, ""); !errors.Is(err, ErrUnknownEvent) {
		t.Errorf("FinishEvent = %v, want ErrUnknownEvent", err)
	}
}

func TestOutbox(t *testing.T) {
	type op struct {
		push *OutboxEntry // or
		ack  uint64
	}
	push := func(uid string, kind OutboxKind, payload string) op {
		return op{push: &OutboxEntry{UID: uid, Kind: kind, Payload: json.RawMessage(payload)}}
	}
	ack := func(seq uint64) op { return op{ack: seq} }
	type want struct {
		seq     uint64
		uid     string
		payload string
	}
	tests := []struct {
		name string
		ops  []op
		want []want
	}{
		{
			name: "delivery in push order",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), push("b", OutboxEventStatus, `{"s":1}`)},
			want: []want{{1, "a", `{"s":1}`}, {2, "b", `{"s":1}`}},
		},
		{
			name: "a newer state replaces the older one",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), push("b", OutboxEventStatus, `{"s":1}`), push("a", OutboxEventStatus, `{"s":2}`)},
			want: []want{{2, "b", `{"s":1}`}, {3, "a", `{"s":2}`}},
		},
		{
			name: "different kinds do not coalesce",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), push("a", OutboxNodeCondition, `{"c":1}`)},
			want: []want{{1, "a", `{"s":1}`}, {2, "a", `{"c":1}`}},
		},
		{
			name: "ack removes the entry",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), push("b", OutboxEventStatus, `{"s":1}`), ack(1)},
			want: []want{{2, "b", `{"s":1}`}},
		},
		{
			name: "acking a superseded entry keeps the newer one",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), push("a", OutboxEventStatus, `{"s":2}`), ack(1), ack(1), ack(99)},
			want: []want{{2, "a", `{"s":2}`}},
		},
		{
			name: "sequence keeps growing after the outbox drains",
			ops:  []op{push("a", OutboxEventStatus, `{"s":1}`), ack(1), push("a", OutboxEventStatus, `{"s":2}`)},
			want: []want{{2, "a", `{"s":2}`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := openJournal(t, journalPath(t), testOptions(t))
			for _, o := range tt.ops {
				if o.push != nil {
					if _, err := j.OutboxPush(*o.push); err != nil {
						t.Fatal(err)
					}
				} else if err := j.OutboxAck(o.ack); err != nil {
					t.Fatal(err)
				}
			}
			got, err := j.OutboxPending()
			if err != nil {
				t.Fatal(err)
			}
			var gotW []want
			for _, e := range got {
				gotW = append(gotW, want{e.Seq, e.UID, string(e.Payload)})
				if !e.Created.Equal(testTime) || e.V != RecordVersion {
					t.Errorf("entry %+v", e)
				}
			}
			if !slices.Equal(gotW, tt.want) {
				t.Errorf("pending = %v, want %v", gotW, tt.want)
			}
			head, ok, err := j.OutboxPeek()
			if err != nil || !ok || head.Seq != tt.want[0].seq {
				t.Errorf("OutboxPeek = %+v, %v, %v; want seq %d", head, ok, err, tt.want[0].seq)
			}
		})
	}
}

func TestOutboxRejectsInvalid(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	for _, e := range []OutboxEntry{
		{Kind: OutboxEventStatus, Payload: json.RawMessage(`{}`)},
		{UID: "a", Payload: json.RawMessage(`{}`)},
		{UID: "a", Kind: OutboxEventStatus},
	} {
		if _, err := j.OutboxPush(e); !errors.Is(err, errInvalidRecord) {
			t.Errorf("OutboxPush(%+v) = %v, want an invalid-record error", e, err)
		}
	}
	if _, ok, err := j.OutboxPeek(); ok || err != nil {
		t.Errorf("OutboxPeek on an empty outbox = %v, %v", ok, err)
	}
}

func TestOwnedChanges(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	prev := "old"
	changes := []Change{
		{Kind: ChangeCordon, Node: "node-a", EventUID: "uid-a"},
		{Kind: ChangeAnnotation, Node: "node-a", Name: "lifecycle.x-k8s.io/maintenance", Value: "true", Previous: &prev, EventUID: "uid-a"},
	}
	wantKeys := []string{"cordon/node-a", "annotation/node-a/lifecycle.x-k8s.io/maintenance"}
	for i, c := range changes {
		key, err := j.AddOwned(c)
		if err != nil || key != wantKeys[i] {
			t.Errorf("AddOwned = %q, %v; want %q", key, err, wantKeys[i])
		}
	}
	if _, err := j.AddOwned(changes[0]); err != nil { // idempotent
		t.Fatal(err)
	}
	if _, err := j.AddOwned(Change{Kind: ChangeAnnotation, Node: "node-a"}); !errors.Is(err, errInvalidRecord) {
		t.Errorf("AddOwned(annotation without name) = %v", err)
	}
	got, err := j.Owned()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key() != wantKeys[1] || got[1].Key() != wantKeys[0] ||
		got[0].Previous == nil || *got[0].Previous != "old" || got[0].Value != "true" || !got[1].At.Equal(testTime) {
		t.Errorf("Owned() = %+v", got)
	}
	if err := j.RemoveOwned("cordon/node-a"); err != nil {
		t.Fatal(err)
	}
	if err := j.RemoveOwned("cordon/node-a"); err != nil {
		t.Fatal(err)
	}
	got, _ = j.Owned()
	if len(got) != 1 || got[0].Kind != ChangeAnnotation {
		t.Errorf("after RemoveOwned: %+v", got)
	}
}

func TestCommitObserver(t *testing.T) {
	opts := testOptions(t)
	var n int
	opts.ObserveCommit = func(d time.Duration) {
		if d < 0 {
			t.Errorf("negative duration %v", d)
		}
		n++
	}
	j, _ := openJournal(t, journalPath(t), opts)
	start := n // Open commits the schema
	mustPutEvent(t, j, testEvent("uid-a"))
	mustAppend(t, j, "uid-a", StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1})
	if _, err := j.AppendStep("nope", StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning}); err == nil {
		t.Fatal("want an error")
	}
	if got := n - start; got != 2 {
		t.Errorf("observed %d commits, want 2 (a failed transaction is not a commit)", got)
	}
}

func TestClosed(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := j.PutEvent(testEvent("a")); !errors.Is(err, ErrClosed) {
		t.Errorf("PutEvent after Close = %v, want ErrClosed", err)
	}
	if _, err := j.Events(); !errors.Is(err, ErrClosed) {
		t.Errorf("Events after Close = %v, want ErrClosed", err)
	}
}

func TestLockedByAnotherOpener(t *testing.T) {
	path := journalPath(t)
	opts := testOptions(t)
	opts.LockTimeout = 200 * time.Millisecond
	j, _ := openJournal(t, path, opts)
	mustPutEvent(t, j, testEvent("uid-a"))

	_, _, err := Open(context.Background(), path, opts)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	wantErrContains(t, err, "journal: locked by another process", path)
	if c := corruptFiles(t, path); len(c) != 0 {
		t.Errorf("a locked file was moved aside: %v", c)
	}
	// The first opener is unaffected.
	if _, ok, err := j.Event("uid-a"); !ok || err != nil {
		t.Errorf("Event after a refused second open = %v, %v", ok, err)
	}
}

func TestEnumStrings(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "step state", got: StepSkipped.String(), want: "Skipped"},
		{name: "phase", got: PhaseDone.String(), want: "Done"},
		{name: "event state", got: EventFinishing.String(), want: "Finishing"},
		{name: "outcome", got: OutcomeSlaExpired.String(), want: "SlaExpired"},
		{name: "outbox kind", got: OutboxNodeCondition.String(), want: "NodeCondition"},
		{name: "change kind", got: ChangeCordon.String(), want: "cordon"},
		{name: "notice kind", got: NoticeStepFailed.String(), want: "StepFailed"},
		{name: "unknown", got: StepState(0).String(), want: "unknown(0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

// TestStoredEnumValues pins the numbers written to disk.
func TestStoredEnumValues(t *testing.T) {
	got := []uint8{
		uint8(StepPending), uint8(StepRunning), uint8(StepDone), uint8(StepFailed), uint8(StepSkipped),
		uint8(PhaseIntent), uint8(PhaseDone),
		uint8(EventClaimed), uint8(EventRunning), uint8(EventAborting), uint8(EventFinishing),
		uint8(OutcomeSucceeded), uint8(OutcomeFailed), uint8(OutcomeSlaExpired), uint8(OutcomeCancelled),
		uint8(OutboxEventStatus), uint8(OutboxNodeCondition),
		uint8(ChangeCordon), uint8(ChangeAnnotation),
		uint8(NoticeClaimed), uint8(NoticeStepFailed), uint8(NoticeEnded),
	}
	want := []uint8{1, 2, 3, 4, 5, 1, 2, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 1, 2, 1, 2, 3}
	if !slices.Equal(got, want) {
		t.Errorf("stored enum values changed: %v, want %v", got, want)
	}
}

// PutEvent's Steps and Owned go in the event's own transaction: all of
// them, or (one refused) none, the event included — an adoption's history
// rebuilt from the API is never half committed.
func TestPutEventWithStepsAndOwned(t *testing.T) {
	j, _ := openJournal(t, journalPath(t), testOptions(t))
	rec := EventRecord{UID: "uid-a", Name: "ev-a", Driver: "reboot", State: EventClaimed,
		Steps: []StepRecord{
			{Step: "reboot", Phase: PhaseIntent, State: StepRunning, Attempt: 1, BootID: "b1"},
			{Step: "reboot", Phase: PhaseDone, State: StepDone, Attempt: 1, BootID: "b1"},
		},
		Owned: []Change{{Kind: ChangeCordon, Node: "node-a", EventUID: "uid-a", Value: "ev-a"}}}
	bad := rec
	bad.UID, bad.Owned = "uid-b", []Change{{Kind: ChangeAnnotation, Node: "node-a", EventUID: "uid-b"}}
	if err := j.PutEvent(bad); !errors.Is(err, errInvalidRecord) {
		t.Fatalf("PutEvent with an invalid owned change = %v, want errInvalidRecord", err)
	}
	if _, ok, err := j.Event("uid-b"); ok || err != nil {
		t.Fatalf("the refused event was committed (%v, %v)", ok, err)
	}
	if steps, _ := j.Steps("uid-b"); len(steps) != 0 {
		t.Fatalf("the refused event's steps were committed: %+v", steps)
	}
	if err := j.PutEvent(rec); err != nil {
		t.Fatal(err)
	}
	steps, err := j.Steps("uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 || steps[0].Seq != 1 || steps[0].Phase != PhaseIntent || steps[1].Seq != 2 || steps[1].State != StepDone || steps[1].At.IsZero() {
		t.Fatalf("steps = %+v", steps)
	}
	owned, err := j.Owned()
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) != 1 || owned[0].Key() != "cordon/node-a" || owned[0].EventUID != "uid-a" {
		t.Fatalf("owned = %+v", owned)
	}
}
