package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// The offline tools below back `lifecycle-agent journal verify|export|compact`
// and are meant for a stopped agent: they wait at most LockTimeout for the
// file lock and fail with ErrLocked while the agent holds it.

// Summary is what Verify reports about a healthy journal.
type Summary struct {
	Path          string `json:"path"`
	SizeBytes     int64  `json:"sizeBytes"`
	SchemaVersion int    `json:"schemaVersion"`
	// The counts are of a current-schema file; an older one shows zero
	// until an agent has opened (and migrated) it.
	Events  int `json:"events"`
	Steps   int `json:"steps"`
	Outbox  int `json:"outbox"`
	Owned   int `json:"owned"`
	History int `json:"history"`
	// Empty: the file has 0 bytes. bbolt creates the file before it writes
	// the first pages, so a crash or a full disk in between leaves one; the
	// agent starts it as a new journal (Open), so it is not corrupt.
	Empty bool `json:"empty,omitempty"`
}

// emptyFile reports whether path is a regular file of 0 bytes: a journal
// never written (see Summary.Empty). A read-only bbolt open of one fails
// with a write error ("bad file descriptor"), so the tools look first.
func emptyFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == 0
}

// Verify checks the journal at path with opts' Checker (a subprocess by
// default) and summarizes it. It never writes to the file. A corrupt or
// too-new file is an error wrapping ErrCorrupt or ErrSchemaTooNew.
func Verify(ctx context.Context, path string, opts Options) (Summary, error) {
	s := Summary{Path: path}
	opts, err := opts.withDefaults()
	if err != nil {
		return s, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return s, fmt.Errorf("journal: verify: %w", err)
	}
	s.SizeBytes = fi.Size()
	if fi.Mode().IsRegular() && fi.Size() == 0 {
		s.Empty = true
		return s, nil
	}
	if err := opts.check(ctx, path); err != nil {
		if errors.Is(err, ErrSchemaTooNew) {
			if found, perr := peekSchema(path, opts.LockTimeout); perr == nil && found > SchemaVersion {
				s.SchemaVersion = found
				return s, schemaTooNew(path, found)
			}
		}
		return s, fmt.Errorf("journal: verify: %w", err)
	}
	db, err := openReadOnly(path, opts.LockTimeout)
	if err != nil {
		return s, err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		if s.SchemaVersion, _, err = schemaVersion(tx); err != nil {
			return err
		}
		if s.SchemaVersion != SchemaVersion {
			return nil
		}
		s.Events = tx.Bucket(bucketEvents).Stats().KeyN
		s.Outbox = tx.Bucket(bucketOutbox).Stats().KeyN
		s.Owned = tx.Bucket(bucketOwned).Stats().KeyN
		s.History = tx.Bucket(bucketHistory).Stats().KeyN
		steps := tx.Bucket(bucketSteps)
		return steps.ForEachBucket(func(uid []byte) error {
			s.Steps += steps.Bucket(uid).Stats().KeyN
			return nil
		})
	})
	if err != nil {
		return s, fmt.Errorf("journal: verify %s: %w", path, err)
	}
	return s, nil
}

// ExportDoc is the JSON document Export writes: every record, as stored.
type ExportDoc struct {
	Path          string          `json:"path"`
	SchemaVersion int             `json:"schemaVersion"`
	Events        []ExportedEvent `json:"events"`
	Outbox        []OutboxEntry   `json:"outbox"`
	Owned         []Change        `json:"owned"`
	History       []HistoryRecord `json:"history"`
	Notices       []Notice        `json:"notices,omitempty"`
	Requests      []AutoRequest   `json:"requests,omitempty"`
	GPUHealth     *GPUHealthState `json:"gpuHealth,omitempty"`
}

// ExportedEvent is an unfinished event with its step log.
type ExportedEvent struct {
	EventRecord
	Steps []StepRecord `json:"steps"`
}

// Export writes the journal at path to w as one indented JSON document
// (ExportDoc). It opens the file read-only and does not run the subprocess
// check: run Verify first on a file that may be damaged.
func Export(path string, w io.Writer) error {
	doc := ExportDoc{Path: path, Events: []ExportedEvent{}, Outbox: []OutboxEntry{}, Owned: []Change{}, History: []HistoryRecord{}}
	if emptyFile(path) {
		return encodeExport(w, path, doc) // nothing in it (schema 0)
	}
	db, err := openReadOnly(path, DefaultLockTimeout)
	if err != nil {
		return err
	}
	defer db.Close()
	j := &Journal{db: db, path: path}
	err = db.View(func(tx *bolt.Tx) error {
		v, _, err := schemaVersion(tx)
		if err != nil {
			return err
		}
		doc.SchemaVersion = v
		switch {
		case v > SchemaVersion:
			return schemaTooNew(path, v)
		case v < SchemaVersion:
			return fmt.Errorf("journal: %s has schema version %d; start the agent once to migrate it to %d before exporting", path, v, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		return err
	}
	events, err := j.Events()
	if err != nil {
		return err
	}
	for _, ev := range events {
		steps, err := j.Steps(ev.UID)
		if err != nil {
			return err
		}
		doc.Events = append(doc.Events, ExportedEvent{EventRecord: ev, Steps: append([]StepRecord{}, steps...)})
	}
	if doc.Outbox, err = j.OutboxPending(); err != nil {
		return err
	}
	if doc.Owned, err = j.Owned(); err != nil {
		return err
	}
	if doc.History, err = j.History(); err != nil {
		return err
	}
	if doc.Notices, err = j.Notices(); err != nil {
		return err
	}
	if doc.Requests, err = j.AutoRequests(); err != nil {
		return err
	}
	if g, ok, err := j.GPUHealth(); err != nil {
		return err
	} else if ok {
		doc.GPUHealth = &g
	}
	return encodeExport(w, path, doc)
}

func encodeExport(w io.Writer, path string, doc ExportDoc) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("journal: export %s: %w", path, err)
	}
	return nil
}

// CompactResult reports the file size before and after Compact.
type CompactResult struct {
	Path        string `json:"path"`
	BeforeBytes int64  `json:"beforeBytes"`
	AfterBytes  int64  `json:"afterBytes"`
}

// Compact rewrites the journal at path into a minimal file: it checks it
// with opts' Checker, copies it with bolt.Compact into "<path>.compact-tmp"
// in the same directory, fsyncs that, renames it over path and fsyncs the
// directory. bbolt files never shrink in place. The source stays open (a
// shared lock, so no agent can write to it) until the rename is durable.
// Bucket sequences, hence outbox and step sequence numbers, are kept.
func Compact(ctx context.Context, path string, opts Options) (CompactResult, error) {
	res := CompactResult{Path: path}
	opts, err := opts.withDefaults()
	if err != nil {
		return res, err
	}
	if emptyFile(path) {
		return res, nil // 0 → 0 bytes: nothing to compact
	}
	if err := opts.check(ctx, path); err != nil {
		return res, fmt.Errorf("journal: compact: %w", err)
	}
	src, srcFile, err := boltOpen(path, &bolt.Options{ReadOnly: true, Timeout: opts.LockTimeout})
	if err != nil {
		return res, err
	}
	defer src.Close()
	if err := src.View(func(tx *bolt.Tx) error {
		v, _, err := schemaVersion(tx)
		if err == nil && v > SchemaVersion {
			err = schemaTooNew(path, v)
		}
		return err
	}); err != nil {
		return res, err
	}
	fi, err := srcFile.Stat()
	if err != nil {
		return res, fmt.Errorf("journal: compact %s: %w", path, err)
	}
	res.BeforeBytes = fi.Size()

	tmp := path + ".compact-tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, fmt.Errorf("journal: compact %s: remove stale %s: %w", path, tmp, err)
	}
	dst, err := bolt.Open(tmp, fileMode, &bolt.Options{Timeout: opts.LockTimeout})
	if err != nil {
		return res, fmt.Errorf("journal: compact %s: create %s: %w", path, tmp, err)
	}
	fail := func(err error) (CompactResult, error) {
		_ = dst.Close()
		_ = os.Remove(tmp)
		return res, fmt.Errorf("journal: compact %s: %w", path, err)
	}
	if err := bolt.Compact(dst, src, 1<<20); err != nil {
		return fail(err)
	}
	if err := dst.Close(); err != nil {
		return fail(err)
	}
	if err := syncFile(tmp); err != nil {
		return fail(err)
	}
	fi, err = os.Stat(tmp)
	if err != nil {
		return fail(err)
	}
	res.AfterBytes = fi.Size()
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return res, fmt.Errorf("journal: compact %s: %w", path, err)
	}
	return res, nil
}
