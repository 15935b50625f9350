package journal

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The outbox holds API writes that the API server has not accepted yet.
// Every entry carries the full desired state for its (UID, Kind), so the
// protocol is:
//
//	seq, _ := j.OutboxPush(e)       // durable; replaces older entries for e.UID and e.Kind
//	e, ok, _ := j.OutboxPeek()      // the oldest entry
//	... send e ...
//	j.OutboxAck(e.Seq)              // after the API server accepted it
//
// Sequence numbers grow with every push and are never reused (compaction
// keeps them), so delivery in sequence order never lets an older state
// overwrite a newer one, and a sender may stamp the sequence on the object
// for the reader to discard stale writes.

// OutboxPush appends e (V, Seq and, when zero, Created are set by the
// journal) and deletes every older entry with the same UID and Kind, which it
// supersedes. It returns e's sequence number.
func (j *Journal) OutboxPush(e OutboxEntry) (uint64, error) {
	j.stampOutbox(&e)
	err := j.update(func(tx *bolt.Tx) error {
		if err := j.outboxPush(tx, &e); err != nil {
			return err
		}
		// gofail: var journalBeforeOutboxCommit struct{}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("journal: outbox push %s for event %s: %w", e.Kind, e.UID, err)
	}
	// gofail: var journalAfterOutboxCommit struct{}
	return e.Seq, nil
}

// stampOutbox sets what the journal sets on an entry it is given.
func (j *Journal) stampOutbox(e *OutboxEntry) {
	e.V = RecordVersion
	if e.Created.IsZero() {
		e.Created = j.clock.Now()
	}
	e.Created = e.Created.UTC()
}

// outboxPush appends e in tx (setting e.Seq) and deletes the older entries
// it supersedes.
func (j *Journal) outboxPush(tx *bolt.Tx, e *OutboxEntry) error {
	b := tx.Bucket(bucketOutbox)
	var stale [][]byte
	err := b.ForEach(func(k, v []byte) error {
		old, err := decodeOutbox(k, v)
		if err != nil {
			return j.corruptf(err, "outbox %x", k)
		}
		if old.UID == e.UID && old.Kind == e.Kind {
			stale = append(stale, k)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	if e.Seq, err = b.NextSequence(); err != nil {
		return err
	}
	v, err := encode(e)
	if err != nil {
		return err
	}
	return b.Put(seqBytes(e.Seq), v)
}

// OutboxPending returns every entry not yet acknowledged, oldest first.
func (j *Journal) OutboxPending() ([]OutboxEntry, error) {
	var out []OutboxEntry
	err := j.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
			e, err := decodeOutbox(k, v)
			if err != nil {
				return j.corruptf(err, "outbox %x", k)
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}

// OutboxPeek returns the oldest entry not yet acknowledged.
func (j *Journal) OutboxPeek() (OutboxEntry, bool, error) {
	var (
		e     OutboxEntry
		found bool
	)
	err := j.view(func(tx *bolt.Tx) error {
		k, v := tx.Bucket(bucketOutbox).Cursor().First()
		if k == nil {
			return nil
		}
		var err error
		if e, err = decodeOutbox(k, v); err != nil {
			return j.corruptf(err, "outbox %x", k)
		}
		found = true
		return nil
	})
	return e, found, err
}

// OutboxAck removes entry seq after the API server accepted it. Acking an
// entry that is gone (acked before, or superseded by a newer push while it
// was being sent) is not an error.
func (j *Journal) OutboxAck(seq uint64) error {
	err := j.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOutbox)
		k := seqBytes(seq)
		if b.Get(k) == nil {
			return errNoChange
		}
		return b.Delete(k)
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return fmt.Errorf("journal: outbox ack %d: %w", seq, err)
	}
	return nil
}
