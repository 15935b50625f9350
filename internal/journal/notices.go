package journal

import (
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketNotify holds the messages for people (notifications.urls) that are
// not delivered to every target yet, key notify/<seq>. It was added to
// schema version 1 without a version bump: it is created on first use, a
// build that predates it ignores it (no reader of the other buckets looks
// at it), and a file without it has no notices.
var bucketNotify = []byte("notify")

// NoticeKind is what a notice is about.
type NoticeKind uint8

const (
	NoticeClaimed    NoticeKind = 1 // an event was claimed (or adopted) by this agent
	NoticeStepFailed NoticeKind = 2 // a step failed and the event is being undone
	NoticeEnded      NoticeKind = 3 // an event reached its end state
)

func (k NoticeKind) String() string { return enumString(uint8(k), "Claimed", "StepFailed", "Ended") }
func (k NoticeKind) valid() bool    { return k >= NoticeClaimed && k <= NoticeEnded }

// Notice is a message for people about an event, key notify/<Seq>. It is
// queued in the same transaction as the event state it reports (see
// EventRecord.Notices), so a crash never loses one and a replay never
// queues it twice; the notifier deletes it once every target took it.
type Notice struct {
	V     int        `json:"v"`
	Seq   uint64     `json:"seq"` // set by the journal; grows with every notice
	UID   string     `json:"uid"` // the event's
	Event string     `json:"event,omitempty"`
	Kind  NoticeKind `json:"kind"`
	Title string     `json:"title,omitempty"`
	Text  string     `json:"text"`
	// Sent lists the targets (notify.TargetID of a URL) that took it.
	Sent     []string  `json:"sent,omitempty"`
	Attempts int       `json:"attempts,omitempty"` // sends tried, all targets together
	Created  time.Time `json:"created"`            // set by the journal when zero
}

func (n *Notice) validate() error {
	if err := checkVersion(n.V); err != nil {
		return err
	}
	switch {
	case n.UID == "":
		return invalid("notice %d: empty uid", n.Seq)
	case !n.Kind.valid():
		return invalid("notice %d: kind %d out of range", n.Seq, n.Kind)
	case n.Text == "":
		return invalid("notice %d: empty text", n.Seq)
	case n.Attempts < 0:
		return invalid("notice %d: negative attempts %d", n.Seq, n.Attempts)
	}
	return nil
}

func decodeNotice(key, b []byte) (Notice, error) {
	var n Notice
	seq, err := seqKey(key)
	if err != nil {
		return n, err
	}
	if err := decode(b, &n); err != nil {
		return n, err
	}
	if err := n.validate(); err != nil {
		return n, err
	}
	if n.Seq != seq {
		return n, invalid("notice under key %d has seq %d", seq, n.Seq)
	}
	return n, nil
}

// pushNotices appends ns in tx, setting their V, Seq and Created.
func (j *Journal) pushNotices(tx *bolt.Tx, ns []Notice) error {
	if len(ns) == 0 {
		return nil
	}
	b, err := tx.CreateBucketIfNotExists(bucketNotify)
	if err != nil {
		return err
	}
	for i := range ns {
		n := &ns[i]
		n.V = RecordVersion
		if n.Created.IsZero() {
			n.Created = j.clock.Now()
		}
		n.Created = n.Created.UTC()
		if err := n.validate(); err != nil {
			return fmt.Errorf("notice: %w", err)
		}
		if n.Seq, err = b.NextSequence(); err != nil {
			return err
		}
		v, err := encode(n)
		if err != nil {
			return err
		}
		if err := b.Put(seqBytes(n.Seq), v); err != nil {
			return err
		}
	}
	return nil
}

// PushNotice queues n on its own (the engine queues its notices with the
// event state they report, through EventRecord.Notices).
func (j *Journal) PushNotice(n Notice) (uint64, error) {
	ns := []Notice{n}
	if err := j.update(func(tx *bolt.Tx) error { return j.pushNotices(tx, ns) }); err != nil {
		return 0, fmt.Errorf("journal: push notice for event %s: %w", n.UID, err)
	}
	return ns[0].Seq, nil
}

// Notices returns the notices not yet delivered to every target, oldest first.
func (j *Journal) Notices() ([]Notice, error) {
	var out []Notice
	err := j.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketNotify)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			n, err := decodeNotice(k, v)
			if err != nil {
				return j.corruptf(err, "notify %x", k)
			}
			out = append(out, n)
			return nil
		})
	})
	return out, err
}

// NoticeAttempted records an attempt of target at notice seq; took says
// the target took it (it joins Sent). Once every one of targets is in Sent
// the notice is deleted, in the same transaction, and done is true. A
// notice that is gone is not an error (done is false: someone else
// finished it).
func (j *Journal) NoticeAttempted(seq uint64, target string, took bool, targets []string) (done bool, err error) {
	err = j.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketNotify)
		if b == nil {
			return errNoChange
		}
		k := seqBytes(seq)
		v := b.Get(k)
		if v == nil {
			return errNoChange
		}
		n, err := decodeNotice(k, v)
		if err != nil {
			return j.corruptf(err, "notify %x", k)
		}
		n.Attempts++
		if took && !slices.Contains(n.Sent, target) {
			n.Sent = append(n.Sent, target)
		}
		if n.SentToAll(targets) {
			done = true
			return b.Delete(k)
		}
		nv, err := encode(&n)
		if err != nil {
			return err
		}
		return b.Put(k, nv)
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return false, fmt.Errorf("journal: notice %d attempted: %w", seq, err)
	}
	return done, nil
}

// SentToAll says whether every one of targets took n.
func (n *Notice) SentToAll(targets []string) bool {
	for _, t := range targets {
		if !slices.Contains(n.Sent, t) {
			return false
		}
	}
	return true
}

// NoticeDone deletes notice seq: every target took it, or it was given up.
// deleted is false when it was gone already (not an error).
func (j *Journal) NoticeDone(seq uint64) (deleted bool, err error) {
	err = j.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketNotify)
		if b == nil || b.Get(seqBytes(seq)) == nil {
			return errNoChange
		}
		deleted = true
		return b.Delete(seqBytes(seq))
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return false, fmt.Errorf("journal: notice %d done: %w", seq, err)
	}
	return deleted, nil
}
