package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketRequests holds the agent's own requests for work (internal/needs'
// Requester: a reboot the node needs, a GPU reset), key requests/<Key>.
// Like bucketNotify it was added to schema version 1 without a version
// bump: created on first use, ignored by builds that predate it, and a
// file without it has no requests.
var bucketRequests = []byte("requests")

// Outcomes of an automatic request's event, as the requester saw it.
const (
	RequestSucceeded  = "Succeeded"
	RequestFailed     = "Failed"
	RequestSlaExpired = "SlaExpired"
	RequestGone       = "Gone" // deleted before it ended (an admin's call)
)

// AutoRequest is one need's request: written before the event is created,
// so that a crash or an outage between the two creates it later rather than
// never, and a restart never creates a second one for the same need. It is
// deleted once the need went away and the event ended.
type AutoRequest struct {
	V     int    `json:"v"`
	Key   string `json:"key"`   // the need: "reboot", "gpu-reset/<uuid>"
	Event string `json:"event"` // the LifecycleEvent's name
	Group string `json:"group"` // its disruption group (the breaker's)
	// Object is the LifecycleEvent as it is created (JSON).
	Object    json.RawMessage `json:"object"`
	Published bool            `json:"published,omitempty"` // the API has it
	Released  bool            `json:"released,omitempty"`  // the need went away
	Outcome   string          `json:"outcome,omitempty"`   // "" while unfinished
	// Counted: the failure is recorded on the group's breaker.
	Counted bool      `json:"counted,omitempty"`
	Created time.Time `json:"created"` // set by the journal when zero
	Updated time.Time `json:"updated"` // set by the journal
}

// Failed says whether the outcome counts against the breaker.
func (r *AutoRequest) Failed() bool {
	return r.Outcome == RequestFailed || r.Outcome == RequestSlaExpired
}

func (r *AutoRequest) validate() error {
	if err := checkVersion(r.V); err != nil {
		return err
	}
	switch {
	case r.Key == "":
		return invalid("request: empty key")
	case r.Event == "" || r.Group == "":
		return invalid("request %s: empty event or group", r.Key)
	case len(r.Object) == 0 || !json.Valid(r.Object):
		return invalid("request %s: object is not JSON", r.Key)
	case r.Outcome != "" && r.Outcome != RequestSucceeded && !r.Failed() && r.Outcome != RequestGone:
		return invalid("request %s: unknown outcome %q", r.Key, r.Outcome)
	case r.Counted && !r.Failed():
		return invalid("request %s: counted without a failure (outcome %q)", r.Key, r.Outcome)
	}
	return nil
}

func decodeRequest(key, b []byte) (AutoRequest, error) {
	var r AutoRequest
	if err := decode(b, &r); err != nil {
		return r, err
	}
	if err := r.validate(); err != nil {
		return r, err
	}
	if r.Key != string(key) {
		return r, invalid("request under key %q has key %q", key, r.Key)
	}
	return r, nil
}

// PutAutoRequest writes r (a new one, or an update), setting V, Updated and,
// when zero, Created.
func (j *Journal) PutAutoRequest(r AutoRequest) error {
	err := j.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketRequests)
		if err != nil {
			return err
		}
		r.V = RecordVersion
		now := j.clock.Now().UTC()
		if r.Created.IsZero() {
			r.Created = now
		}
		r.Created, r.Updated = r.Created.UTC(), now
		v, err := encode(&r)
		if err != nil {
			return err
		}
		return b.Put([]byte(r.Key), v)
	})
	if err != nil {
		return fmt.Errorf("journal: put request %s: %w", r.Key, err)
	}
	return nil
}

// AutoRequests returns every request, by key.
func (j *Journal) AutoRequests() ([]AutoRequest, error) {
	var out []AutoRequest
	err := j.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRequests)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			r, err := decodeRequest(k, v)
			if err != nil {
				return j.corruptf(err, "requests %q", k)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// DeleteAutoRequest forgets the request of key; one that is gone is not an
// error.
func (j *Journal) DeleteAutoRequest(key string) error {
	err := j.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRequests)
		if b == nil || b.Get([]byte(key)) == nil {
			return errNoChange
		}
		return b.Delete([]byte(key))
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return fmt.Errorf("journal: delete request %s: %w", key, err)
	}
	return nil
}
