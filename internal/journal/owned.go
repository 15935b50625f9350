package journal

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// AddOwned records that the agent made change c and must undo it. Record it
// before acting (a replay then finds it and checks the object); adding the
// same change again replaces the record. V is set by the journal, At when
// zero. It returns c.Key().
func (j *Journal) AddOwned(c Change) (string, error) {
	j.stampOwned(&c)
	err := j.update(func(tx *bolt.Tx) error {
		if err := putOwned(tx, c); err != nil {
			return err
		}
		// gofail: var journalBeforeOwnedCommit struct{}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("journal: add owned change %s: %w", c.Key(), err)
	}
	// gofail: var journalAfterOwnedCommit struct{}
	return c.Key(), nil
}

// Owned returns the changes the agent must undo, ordered by key.
func (j *Journal) Owned() ([]Change, error) {
	var out []Change
	err := j.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketOwned).ForEach(func(k, v []byte) error {
			c, err := decodeChange(k, v)
			if err != nil {
				return j.corruptf(err, "owned change %q", k)
			}
			out = append(out, c)
			return nil
		})
	})
	return out, err
}

// RemoveOwned forgets change key after it was undone. Removing a key that is
// not there is not an error.
func (j *Journal) RemoveOwned(key string) error {
	err := j.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOwned)
		if b.Get([]byte(key)) == nil {
			return errNoChange
		}
		return b.Delete([]byte(key))
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return fmt.Errorf("journal: remove owned change %s: %w", key, err)
	}
	return nil
}

// stampOwned sets c's version, and its time when zero.
func (j *Journal) stampOwned(c *Change) {
	c.V = RecordVersion
	if c.At.IsZero() {
		c.At = j.clock.Now()
	}
	c.At = c.At.UTC()
}

func putOwned(tx *bolt.Tx, c Change) error {
	v, err := encode(&c)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketOwned).Put([]byte(c.Key()), v)
}
