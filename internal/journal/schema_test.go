package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// rawUpdate edits a journal file with bbolt directly, as another agent
// version would.
func rawUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func setSchema(v uint64) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint64(nil, v))
	}
}

func TestSchemaTooNewIsRefusedAndUntouched(t *testing.T) {
	path := journalPath(t)
	fillJournal(t, path, 2)
	rawUpdate(t, path, setSchema(SchemaVersion+1))
	sum := fileSum(t, path)
	opts := testOptions(t)
	wantParts := []string{"journal: schema too new", path, fmt.Sprintf("schema version %d", SchemaVersion+1), fmt.Sprintf("up to %d", SchemaVersion)}

	tests := []struct {
		name string
		run  func() error
	}{
		{name: "Open", run: func() error {
			j, _, err := Open(context.Background(), path, opts)
			if err == nil {
				_ = j.Close()
			}
			return err
		}},
		{name: "Open with a checker that misses it", run: func() error {
			o := opts
			o.Checker = func(context.Context, string) error { return nil }
			_, _, err := Open(context.Background(), path, o)
			return err
		}},
		{name: "Verify", run: func() error {
			_, err := Verify(context.Background(), path, opts)
			return err
		}},
		{name: "Export", run: func() error {
			return Export(path, &bytes.Buffer{})
		}},
		{name: "Compact", run: func() error {
			_, err := Compact(context.Background(), path, opts)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if !errors.Is(err, ErrSchemaTooNew) {
				t.Fatalf("err = %v, want ErrSchemaTooNew", err)
			}
			wantErrContains(t, err, wantParts...)
			if got := fileSum(t, path); got != sum {
				t.Errorf("file changed: sha256 %s, was %s", got, sum)
			}
			if c := corruptFiles(t, path); len(c) != 0 {
				t.Errorf("moved aside: %v", c)
			}
		})
	}
}

// writeV0Fixture writes the unversioned prototype layout (schema version 0).
func writeV0Fixture(t *testing.T, path string, stepPhase string) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		events, err := tx.CreateBucket([]byte("events"))
		if err != nil {
			return err
		}
		ev, err := events.CreateBucket([]byte("uid-v0"))
		if err != nil {
			return err
		}
		meta := `{"state":"Running","spec":{"transitionName":"reboot-node-a","bindingNode":"node-a"},"resourceVersion":"7"}`
		if err := ev.Put([]byte("meta"), []byte(meta)); err != nil {
			return err
		}
		steps, err := ev.CreateBucket([]byte("steps"))
		if err != nil {
			return err
		}
		for _, s := range []string{
			`{"step":"cordon","phase":"intent","bootID":"boot-1","at":"2026-11-29T08:00:00Z"}`,
			`{"step":"cordon","phase":"done","bootID":"boot-1","at":"2026-11-29T08:00:01Z"}`,
			`{"step":"reboot","phase":"` + stepPhase + `","bootID":"boot-1","at":"2026-11-29T08:00:02Z"}`,
		} {
			seq, err := steps.NextSequence()
			if err != nil {
				return err
			}
			if err := steps.Put(seqBytes(seq), []byte(s)); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestMigrateFromV0(t *testing.T) {
	path := journalPath(t)
	writeV0Fixture(t, path, "intent")

	j, rep := openJournal(t, path, testOptions(t))

	if rep.FoundSchema != 0 || rep.Created || len(rep.Migrations) != 1 || rep.SchemaVersion != SchemaVersion {
		t.Errorf("report = %+v, want one migration from 0", rep)
	}
	ev, ok, err := j.Event("uid-v0")
	if err != nil || !ok {
		t.Fatalf("Event(uid-v0) = %v, %v", ok, err)
	}
	if ev.State != EventRunning || ev.ResourceVersion != "7" || !bytes.Contains(ev.Object, []byte(`"spec":{"transitionName":"reboot-node-a"`)) {
		t.Errorf("migrated event = %+v (object %s)", ev, ev.Object)
	}
	steps, err := j.Steps("uid-v0")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		step  string
		phase StepPhase
		state StepState
	}{{"cordon", PhaseIntent, StepRunning}, {"cordon", PhaseDone, StepDone}, {"reboot", PhaseIntent, StepRunning}}
	if len(steps) != len(want) {
		t.Fatalf("steps = %+v", steps)
	}
	for i, s := range steps {
		if s.Step != want[i].step || s.Phase != want[i].phase || s.State != want[i].state || s.BootID != "boot-1" || s.Seq != uint64(i+1) || s.Attempt != 1 {
			t.Errorf("step %d = %+v, want %+v", i, s, want[i])
		}
	}
	if last, _, _ := j.LastStep("uid-v0"); last.Step != "reboot" || !last.At.Equal(time.Date(2026, 11, 29, 8, 0, 2, 0, time.UTC)) {
		t.Errorf("LastStep = %+v", last)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// The migrated file is a clean current-schema journal.
	if v, err := peekSchema(path, time.Second); err != nil || v != SchemaVersion {
		t.Errorf("schema on disk = %d, %v", v, err)
	}
	if err := CheckFile(path, time.Second); err != nil {
		t.Errorf("CheckFile after migration: %v", err)
	}
}

// A migration that fails rolls back: the file is left exactly as it was.
func TestMigrationFailureLeavesFileUntouched(t *testing.T) {
	path := journalPath(t)
	writeV0Fixture(t, path, "half-done")
	sum := fileSum(t, path)

	_, _, err := Open(context.Background(), path, testOptions(t))
	wantErrContains(t, err, path, "migration", `unknown phase "half-done"`)
	if got := fileSum(t, path); got != sum {
		t.Errorf("file changed by a failed migration")
	}
	if c := corruptFiles(t, path); len(c) != 0 {
		t.Errorf("moved aside: %v", c)
	}
}

func TestMigrationTableIsComplete(t *testing.T) {
	for v := 0; v < SchemaVersion; v++ {
		if _, ok := findMigration(v); !ok {
			t.Errorf("no migration from schema version %d", v)
		}
	}
	for i, m := range migrations {
		if m.from != i || m.name == "" || m.apply == nil {
			t.Errorf("migrations[%d] = {from: %d, name: %q}: want from %d, a name and a function", i, m.from, m.name, i)
		}
	}
	if len(migrations) != SchemaVersion {
		t.Errorf("%d migrations for schema version %d", len(migrations), SchemaVersion)
	}
}

func TestMetaSchemaCorrupt(t *testing.T) {
	path := journalPath(t)
	fillJournal(t, path, 1)
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, []byte("one"))
	})
	j, rep := openJournal(t, path, testOptions(t))
	if rep.Corruption == nil || rep.Corruption.MovedTo != path+corruptSuffix {
		t.Fatalf("report = %+v, want the file moved aside", rep)
	}
	wantErrContains(t, rep.Corruption.Err, "meta/schema")
	if evs, _ := j.Events(); len(evs) != 0 {
		t.Errorf("fresh journal has events %v", evs)
	}
}
