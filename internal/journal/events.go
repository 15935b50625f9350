package journal

import (
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// PutEvent stores the snapshot of an unfinished event, replacing any earlier
// snapshot with the same UID. V is set by the journal, Updated when zero.
// The outbox entries given are pushed (as OutboxPush does, in order) in the
// same transaction: an end state journaled is never without the writes
// that report it. So are rec.Notices, in the notify bucket.
func (j *Journal) PutEvent(rec EventRecord, push ...OutboxEntry) error {
	rec.V = RecordVersion
	if rec.Updated.IsZero() {
		rec.Updated = j.clock.Now()
	}
	rec.Updated = rec.Updated.UTC()
	if rec.State == EventFinishing {
		// A journal that refuses an event's end state (a full disk): the
		// crash tests inject it here (test/crash TestJournalFullAtFinish).
		// gofail: var journalFinishingWriteError string
		// return fmt.Errorf("journal: put event %s: write: no space left on device (failpoint: %s)", rec.UID, journalFinishingWriteError)
	}
	for i := range push {
		j.stampOutbox(&push[i])
	}
	steps, owned := slices.Clone(rec.Steps), slices.Clone(rec.Owned)
	for i := range steps {
		j.stampStep(&steps[i])
	}
	for i := range owned {
		j.stampOwned(&owned[i])
	}
	err := j.update(func(tx *bolt.Tx) error {
		if err := putEvent(tx, rec); err != nil {
			return err
		}
		for _, st := range steps {
			if _, err := appendStep(tx, rec.UID, st); err != nil {
				return err
			}
		}
		for _, c := range owned {
			if err := putOwned(tx, c); err != nil {
				return err
			}
		}
		for i := range push {
			if err := j.outboxPush(tx, &push[i]); err != nil {
				return err
			}
		}
		if err := j.pushNotices(tx, rec.Notices); err != nil {
			return err
		}
		// gofail: var journalBeforeEventCommit struct{}
		return nil
	})
	if err != nil {
		return fmt.Errorf("journal: put event %s: %w", rec.UID, err)
	}
	// gofail: var journalAfterEventCommit struct{}
	if rec.State == EventFinishing {
		finishingCommitted()
	}
	return nil
}

// finishingCommitted runs right after an end state is committed: a crash
// there is test/crash TestCrashAfterFinishingCommit.
func finishingCommitted() {
	// gofail: var journalAfterFinishingCommit struct{}
}

func putEvent(tx *bolt.Tx, rec EventRecord) error {
	b, err := encode(&rec)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketEvents).Put([]byte(rec.UID), b)
}

// Event returns the snapshot of the unfinished event uid.
func (j *Journal) Event(uid string) (EventRecord, bool, error) {
	var (
		rec   EventRecord
		found bool
	)
	err := j.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketEvents).Get([]byte(uid))
		if v == nil {
			return nil
		}
		var err error
		rec, err = decodeEvent([]byte(uid), v)
		if err != nil {
			return j.corruptf(err, "event %s", uid)
		}
		found = true
		return nil
	})
	return rec, found, err
}

// Events returns the unfinished events, ordered by UID.
func (j *Journal) Events() ([]EventRecord, error) {
	var out []EventRecord
	err := j.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEvents).ForEach(func(k, v []byte) error {
			rec, err := decodeEvent(k, v)
			if err != nil {
				return j.corruptf(err, "event %q", k)
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, err
}

// AppendStep appends rec to the step log of event uid and returns its
// sequence number (1, 2, ... per event). The event must have a snapshot.
// V and Seq are set by the journal, At when zero. The record is durable
// when AppendStep returns: write PhaseIntent before acting and PhaseDone
// after.
func (j *Journal) AppendStep(uid string, rec StepRecord) (uint64, error) {
	j.stampStep(&rec)
	var seq uint64
	err := j.update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketEvents).Get([]byte(uid)) == nil {
			return fmt.Errorf("%w %q", ErrUnknownEvent, uid)
		}
		var err error
		seq, err = appendStep(tx, uid, rec)
		if err != nil {
			return err
		}
		switch rec.Phase {
		case PhaseIntent:
			// gofail: var journalBeforeStepIntentCommit struct{}
		case PhaseDone:
			// gofail: var journalBeforeStepDoneCommit struct{}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("journal: append step %q (%s) of event %s: %w", rec.Step, rec.Phase, uid, err)
	}
	switch rec.Phase {
	case PhaseIntent:
		// gofail: var journalAfterStepIntentCommit struct{}
	case PhaseDone:
		// gofail: var journalAfterStepDoneCommit struct{}
	}
	return seq, nil
}

// stampStep sets rec's version, and its time when zero.
func (j *Journal) stampStep(rec *StepRecord) {
	rec.V = RecordVersion
	if rec.At.IsZero() {
		rec.At = j.clock.Now()
	}
}

func appendStep(tx *bolt.Tx, uid string, rec StepRecord) (uint64, error) {
	b, err := tx.Bucket(bucketSteps).CreateBucketIfNotExists([]byte(uid))
	if err != nil {
		return 0, err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return 0, err
	}
	rec.Seq = seq
	rec.At = rec.At.UTC()
	v, err := encode(&rec)
	if err != nil {
		return 0, err
	}
	return seq, b.Put(seqBytes(seq), v)
}

// Steps returns the step log of event uid, oldest first; empty when the
// event has none (or is unknown).
func (j *Journal) Steps(uid string) ([]StepRecord, error) {
	var out []StepRecord
	err := j.view(func(tx *bolt.Tx) error {
		var err error
		out, err = j.steps(tx, uid)
		return err
	})
	return out, err
}

func (j *Journal) steps(tx *bolt.Tx, uid string) ([]StepRecord, error) {
	b := tx.Bucket(bucketSteps).Bucket([]byte(uid))
	if b == nil {
		return nil, nil
	}
	var out []StepRecord
	err := b.ForEach(func(k, v []byte) error {
		rec, err := decodeStep(k, v)
		if err != nil {
			return j.corruptf(err, "step %x of event %s", k, uid)
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}

// LastStep returns the newest record of event uid's step log: what replay
// resumes from.
func (j *Journal) LastStep(uid string) (StepRecord, bool, error) {
	var (
		rec   StepRecord
		found bool
	)
	err := j.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSteps).Bucket([]byte(uid))
		if b == nil {
			return nil
		}
		k, v := b.Cursor().Last()
		if k == nil {
			return nil
		}
		var err error
		rec, err = decodeStep(k, v)
		if err != nil {
			return j.corruptf(err, "step %x of event %s", k, uid)
		}
		found = true
		return nil
	})
	return rec, found, err
}

// FinishEvent moves event uid, with its step log, into the history, and
// drops the oldest history records beyond the cap. Its outbox entries and
// owned changes are kept: they outlive the event.
func (j *Journal) FinishEvent(uid string, outcome Outcome, message string) error {
	h := HistoryRecord{V: RecordVersion, Outcome: outcome, Message: message, Finished: j.clock.Now().UTC()}
	err := j.update(func(tx *bolt.Tx) error {
		events := tx.Bucket(bucketEvents)
		v := events.Get([]byte(uid))
		if v == nil {
			return fmt.Errorf("%w %q", ErrUnknownEvent, uid)
		}
		var err error
		if h.Event, err = decodeEvent([]byte(uid), v); err != nil {
			return j.corruptf(err, "event %s", uid)
		}
		if h.Steps, err = j.steps(tx, uid); err != nil {
			return err
		}
		hist := tx.Bucket(bucketHistory)
		if h.Seq, err = hist.NextSequence(); err != nil {
			return err
		}
		b, err := encode(&h)
		if err != nil {
			return err
		}
		if err := hist.Put(seqBytes(h.Seq), b); err != nil {
			return err
		}
		if err := trimToCap(hist, j.historyCap); err != nil {
			return err
		}
		if err := events.Delete([]byte(uid)); err != nil {
			return err
		}
		if steps := tx.Bucket(bucketSteps); steps.Bucket([]byte(uid)) != nil {
			if err := steps.DeleteBucket([]byte(uid)); err != nil {
				return err
			}
		}
		// gofail: var journalBeforeFinishCommit struct{}
		return nil
	})
	if err != nil {
		return fmt.Errorf("journal: finish event %s: %w", uid, err)
	}
	// gofail: var journalAfterFinishCommit struct{}
	return nil
}

// trimToCap deletes the oldest keys of b until at most limit remain.
func trimToCap(b *bolt.Bucket, limit int) error {
	// Count with a cursor: Stats reads committed pages and would miss the
	// record just put in this transaction.
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	for k, _ := c.First(); k != nil && n > limit; k, _ = c.First() {
		if err := b.Delete(k); err != nil {
			return err
		}
		n--
	}
	return nil
}

// History returns the finished events kept, oldest first.
func (j *Journal) History() ([]HistoryRecord, error) {
	var out []HistoryRecord
	err := j.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketHistory).ForEach(func(k, v []byte) error {
			h, err := decodeHistory(k, v)
			if err != nil {
				return j.corruptf(err, "history %x", k)
			}
			out = append(out, h)
			return nil
		})
	})
	return out, err
}
