package intake

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketProgress lists the progress messages posted and not yet deleted,
// by message key, so that a restart finds the ones a crash or a failed
// delete left behind without walking the inbox. Created by the first
// write, like sessions: no schema change.
var bucketProgress = []byte("progress")

// setProgressMessage records the platform id of message key's progress
// message, in its inbox entry and in the progress index, in one commit.
func (s *store) setProgressMessage(key, id string, now time.Time) error {
	return s.write(func(tx *bolt.Tx) error {
		left, err := update(inboxQueue(tx), key, now, func(m *inboxEntry) { m.ProgressMessage = id })
		if err != nil {
			return err
		}
		if left {
			tx.OnCommit(func() { s.inboxPending.Add(-1) })
		}
		b, err := tx.CreateBucketIfNotExists(bucketProgress)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte(id))
	})
}

// progressGone forgets message key's progress message: deleted, already
// gone, or given up on. A message retention pruned is no error.
func (s *store) progressGone(key string, now time.Time) error {
	return s.write(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketProgress); b != nil {
			if err := b.Delete([]byte(key)); err != nil {
				return err
			}
		}
		messages, _, _ := inboxBuckets(tx)
		if messages.Get([]byte(key)) == nil {
			return nil
		}
		_, err := update(inboxQueue(tx), key, now, func(m *inboxEntry) { m.ProgressMessage = "" })
		return err
	})
}

// leftoverProgress lists the progress messages whose reply is posted (or
// refused for good) but which were not deleted: a crash came between the
// answer and the delete, or every delete failed. Index entries whose
// message is gone (retention) are dropped.
func (s *store) leftoverProgress() (out []inboxEntry, err error) {
	var dangling [][]byte
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketProgress)
		if b == nil {
			return nil
		}
		messages, _, _ := inboxBuckets(tx)
		replies, _, _ := outboxBuckets(tx)
		return b.ForEach(func(k, _ []byte) error {
			v := messages.Get(k)
			if v == nil {
				dangling = append(dangling, append([]byte(nil), k...))
				return nil
			}
			var m inboxEntry
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("inbox entry %q: %w", k, err)
			}
			if m.ProgressMessage == "" || m.RunID == "" {
				return nil
			}
			rv := replies.Get([]byte(m.RunID))
			if rv == nil {
				return nil // no reply yet: finishProgress deletes it
			}
			var r outboxEntry
			if err := json.Unmarshal(rv, &r); err != nil {
				return fmt.Errorf("outbox entry %q: %w", m.RunID, err)
			}
			if r.State == stateDelivered || r.State == stateFailed {
				out = append(out, m)
			}
			return nil
		})
	})
	if err != nil || len(dangling) == 0 {
		return out, err
	}
	return out, s.write(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketProgress)
		for _, k := range dangling {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
