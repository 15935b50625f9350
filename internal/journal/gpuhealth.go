package journal

import (
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketGPUHealth holds the GPU health monitor's state (internal/gpuhealth),
// one record under key "state". Like bucketNotify it was added to schema
// version 1 without a version bump: created on first use, ignored by builds
// that predate it; a file without it has no GPU state.
var (
	bucketGPUHealth = []byte("gpuhealth")
	keyGPUHealth    = []byte("state")
)

// GPUHealthState is what the GPU health monitor must not forget across a
// restart of the agent: the critical XIDs latched per GPU (cleared only by
// a GPU reset, or by a reboot for those a reboot cures), and how far it has
// read the kernel log in which boot, so XIDs logged while the agent was
// down are read at start and those already judged are not read twice.
type GPUHealthState struct {
	V    int    `json:"v"`
	Boot string `json:"boot"` // the boot ID the XIDs and KernelLogSeq belong to
	// KernelLogSeq is the sequence number of the last kernel log record
	// read (or skipped) in Boot.
	KernelLogSeq uint64 `json:"kernelLogSeq,omitempty"`
	// XIDs are the latched critical XIDs per GPU UUID, each list sorted.
	XIDs    map[string][]uint64 `json:"xids,omitempty"`
	Updated time.Time           `json:"updated"` // set by the journal
}

// Equal reports whether two states record the same boot, position and XIDs
// (Updated aside).
func (s GPUHealthState) Equal(o GPUHealthState) bool {
	if s.Boot != o.Boot || s.KernelLogSeq != o.KernelLogSeq || len(s.XIDs) != len(o.XIDs) {
		return false
	}
	for u, x := range s.XIDs {
		if y, ok := o.XIDs[u]; !ok || !slices.Equal(x, y) {
			return false
		}
	}
	return true
}

func (s *GPUHealthState) validate() error {
	if err := checkVersion(s.V); err != nil {
		return err
	}
	if s.Boot == "" {
		return invalid("gpu health: empty boot ID")
	}
	for u, x := range s.XIDs {
		switch {
		case u == "":
			return invalid("gpu health: XIDs under an empty GPU UUID")
		case len(x) == 0:
			return invalid("gpu health: %s: empty XID list", u)
		case !slices.IsSorted(x) || len(slices.Compact(slices.Clone(x))) != len(x):
			return invalid("gpu health: %s: XIDs %v not sorted and distinct", u, x)
		}
	}
	return nil
}

func decodeGPUHealth(key, b []byte) (GPUHealthState, error) {
	var s GPUHealthState
	if err := decode(b, &s); err != nil {
		return s, err
	}
	if string(key) != string(keyGPUHealth) {
		return s, invalid("gpu health record under key %q", key)
	}
	return s, s.validate()
}

// GPUHealth returns the GPU health state, and false when none was written.
func (j *Journal) GPUHealth() (GPUHealthState, bool, error) {
	var s GPUHealthState
	var ok bool
	err := j.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGPUHealth)
		if b == nil {
			return nil
		}
		v := b.Get(keyGPUHealth)
		if v == nil {
			return nil
		}
		var err error
		if s, err = decodeGPUHealth(keyGPUHealth, v); err != nil {
			return j.corruptf(err, "gpuhealth/state")
		}
		ok = true
		return nil
	})
	return s, ok, err
}

// PutGPUHealth replaces the GPU health state, setting V and Updated. The
// XID lists are sorted and made distinct.
func (j *Journal) PutGPUHealth(s GPUHealthState) error {
	xids := make(map[string][]uint64, len(s.XIDs))
	for u, x := range s.XIDs {
		if len(x) > 0 {
			x = slices.Clone(x)
			slices.Sort(x)
			xids[u] = slices.Compact(x)
		}
	}
	s.XIDs = xids
	err := j.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketGPUHealth)
		if err != nil {
			return err
		}
		s.V, s.Updated = RecordVersion, j.clock.Now().UTC()
		v, err := encode(&s)
		if err != nil {
			return err
		}
		return b.Put(keyGPUHealth, v)
	})
	if err != nil {
		return fmt.Errorf("journal: put GPU health state: %w", err)
	}
	return nil
}
