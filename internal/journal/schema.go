package journal

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the on-disk schema this build reads and writes.
const SchemaVersion = 1

// Top-level buckets of schema version 1 (see doc.go).
var (
	bucketMeta    = []byte("meta")
	bucketEvents  = []byte("events")
	bucketSteps   = []byte("steps")
	bucketOutbox  = []byte("outbox")
	bucketOwned   = []byte("owned")
	bucketHistory = []byte("history")

	keySchema = []byte("schema") // in meta: 8-byte big-endian uint64
)

var v1Buckets = [][]byte{bucketMeta, bucketEvents, bucketSteps, bucketOutbox, bucketOwned, bucketHistory}

// migration turns schema version from into from+1 inside one read-write
// transaction. A migration must be a pure function of the transaction's
// contents and now: it runs at most once per file, and a failure rolls the
// whole upgrade back, leaving the file as it was.
type migration struct {
	from  int
	name  string
	apply func(tx *bolt.Tx, now time.Time) error
}

// migrations is the table of schema upgrades, ordered by from. To add schema
// version N: bump SchemaVersion to N, append {from: N-1, ...}, and keep every
// earlier entry (an agent may meet a file of any older version).
var migrations = []migration{
	{from: 0, name: "v0→v1: unversioned prototype layout to versioned buckets", apply: migrateV0ToV1},
}

// schemaVersion reads the version stored in tx. A file without a meta bucket
// is version 0: either a file that bbolt initialized but that holds no bucket
// yet (empty is true), or the unversioned prototype layout.
func schemaVersion(tx *bolt.Tx) (version int, empty bool, err error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty = true
		err = tx.ForEach(func([]byte, *bolt.Bucket) error {
			empty = false
			return nil
		})
		return 0, empty, err
	}
	b := meta.Get(keySchema)
	if len(b) != 8 {
		return 0, false, fmt.Errorf("%w: meta/schema is %d bytes, want 8", ErrCorrupt, len(b))
	}
	v := binary.BigEndian.Uint64(b)
	if v == 0 || v > 1<<31 {
		return 0, false, fmt.Errorf("%w: meta/schema holds %d", ErrCorrupt, v)
	}
	return int(v), false, nil
}

func putSchemaVersion(tx *bolt.Tx, v int) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	return meta.Put(keySchema, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// initCurrent lays out an empty file at SchemaVersion.
func initCurrent(tx *bolt.Tx) error {
	if err := createV1Buckets(tx); err != nil {
		return err
	}
	return putSchemaVersion(tx, SchemaVersion)
}

// createV1Buckets creates the top-level buckets of schema version 1.
func createV1Buckets(tx *bolt.Tx) error {
	for _, name := range v1Buckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// upgrade brings tx from version found to SchemaVersion and returns the names
// of the migrations it applied.
func upgrade(tx *bolt.Tx, found int, now time.Time) ([]string, error) {
	var applied []string
	for v := found; v < SchemaVersion; v++ {
		m, ok := findMigration(v)
		if !ok {
			return applied, fmt.Errorf("journal: no migration from schema version %d", v)
		}
		if err := m.apply(tx, now); err != nil {
			return applied, fmt.Errorf("journal: migration %q: %w", m.name, err)
		}
		if err := putSchemaVersion(tx, v+1); err != nil {
			return applied, err
		}
		applied = append(applied, m.name)
	}
	return applied, nil
}

func findMigration(from int) (migration, bool) {
	for _, m := range migrations {
		if m.from == from {
			return m, true
		}
	}
	return migration{}, false
}

// Version 0 is the unversioned layout of the compatibility prototype
// (technical brief §4), never released:
//
//	events/<uid>/meta          JSON {"state": "Claimed"|"Running", "spec": {...}, "resourceVersion": "..."}
//	events/<uid>/steps/<BE u64> JSON {"step": "...", "phase": "intent"|"done", "bootID": "...", "at": RFC 3339}
type v0Meta struct {
	State           string          `json:"state"`
	Spec            json.RawMessage `json:"spec"`
	ResourceVersion string          `json:"resourceVersion"`
}

type v0Step struct {
	Step   string    `json:"step"`
	Phase  string    `json:"phase"`
	BootID string    `json:"bootID"`
	At     time.Time `json:"at"`
}

func migrateV0ToV1(tx *bolt.Tx, now time.Time) error {
	type event struct {
		rec   EventRecord
		steps []StepRecord
	}
	var events []event
	if old := tx.Bucket(bucketEvents); old != nil {
		err := old.ForEachBucket(func(uid []byte) error {
			eb := old.Bucket(uid)
			var m v0Meta
			if err := decode(eb.Get([]byte("meta")), &m); err != nil {
				return fmt.Errorf("v0 event %q meta: %w", uid, err)
			}
			ev := event{rec: EventRecord{
				V: RecordVersion, UID: string(uid), ResourceVersion: m.ResourceVersion, Updated: now,
			}}
			switch m.State {
			case "Claimed":
				ev.rec.State = EventClaimed
			case "Running":
				ev.rec.State = EventRunning
			default:
				return fmt.Errorf("v0 event %q: unknown state %q", uid, m.State)
			}
			if len(m.Spec) > 0 {
				obj, err := json.Marshal(map[string]json.RawMessage{"spec": m.Spec})
				if err != nil {
					return err
				}
				ev.rec.Object = obj
			}
			if sb := eb.Bucket([]byte("steps")); sb != nil {
				err := sb.ForEach(func(k, v []byte) error {
					var s v0Step
					if err := decode(v, &s); err != nil {
						return fmt.Errorf("v0 event %q step %x: %w", uid, k, err)
					}
					r := StepRecord{V: RecordVersion, Step: s.Step, BootID: s.BootID, At: s.At.UTC(), Attempt: 1}
					switch s.Phase {
					case "intent":
						r.Phase, r.State = PhaseIntent, StepRunning
					case "done":
						r.Phase, r.State = PhaseDone, StepDone
					default:
						return fmt.Errorf("v0 event %q step %x: unknown phase %q", uid, k, s.Phase)
					}
					ev.steps = append(ev.steps, r)
					return nil
				})
				if err != nil {
					return err
				}
			}
			events = append(events, ev)
			return nil
		})
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(bucketEvents); err != nil {
			return err
		}
	}
	if err := createV1Buckets(tx); err != nil {
		return err
	}
	// putEvent and appendStep write the current format, which is v1. When
	// v2 changes either, freeze copies of the v1 writers for this migration.
	for _, ev := range events {
		if err := putEvent(tx, ev.rec); err != nil {
			return err
		}
		for _, s := range ev.steps {
			if _, err := appendStep(tx, ev.rec.UID, s); err != nil {
				return err
			}
		}
	}
	return nil
}
