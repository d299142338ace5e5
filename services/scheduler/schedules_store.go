package scheduler

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/schedules"
)

// bucketSchedules holds one schedules.Record per [[schedules]] job, by its
// id: its last firing and until when the table kept its time, so a
// restarted scheduler lists them and catches up a missed job. Created at
// the first write; a reload removes the records of the jobs it removed.
var bucketSchedules = []byte("schedules")

// scheduleStore is the table's schedules.Store in scheduler.db. Its
// writes join the group commit.
type scheduleStore struct{ st *store }

func (ss scheduleStore) Records() (map[string]schedules.Record, error) {
	out := map[string]schedules.Record{}
	err := ss.st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSchedules)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			// An undecodable record reads as none: the next firing
			// writes it afresh.
			if rec, ok := decodeScheduleRecord(v); ok {
				out[string(k)] = rec
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", bucketSchedules, err)
	}
	return out, nil
}

func (ss scheduleStore) Update(id string, fn func(*schedules.Record)) error {
	return ss.st.write(func(tx *bolt.Tx) error {
		return updateScheduleRecord(tx, id, func(rec *schedules.Record) bool { fn(rec); return true })
	})
}

func (ss scheduleStore) Keep(ids []string) error {
	keep := make(map[string]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	return ss.st.write(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSchedules)
		if b == nil {
			return nil
		}
		var gone [][]byte
		if err := b.ForEach(func(k, _ []byte) error {
			if !keep[string(k)] {
				gone = append(gone, k)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range gone {
			if err := b.Delete(k); err != nil {
				return fmt.Errorf("cannot remove the record of schedule %q: %w", k, err)
			}
		}
		return nil
	})
}

func decodeScheduleRecord(v []byte) (schedules.Record, bool) {
	var rec schedules.Record
	if v == nil || json.Unmarshal(v, &rec) != nil {
		return schedules.Record{}, false
	}
	return rec, true
}

// updateScheduleRecord changes job id's record in tx when fn says so.
func updateScheduleRecord(tx *bolt.Tx, id string, fn func(*schedules.Record) bool) error {
	b, err := tx.CreateBucketIfNotExists(bucketSchedules)
	if err != nil {
		return fmt.Errorf("cannot create bucket %s: %w", bucketSchedules, err)
	}
	rec, _ := decodeScheduleRecord(b.Get([]byte(id)))
	if !fn(&rec) {
		return nil
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cannot encode the record of schedule %q: %w", id, err)
	}
	if err := b.Put([]byte(id), data); err != nil {
		return fmt.Errorf("cannot store the record of schedule %q: %w", id, err)
	}
	return nil
}

// noteScheduledRun keeps a scheduled run's job record in step with the
// run, in the transaction that writes the run (putRun): the run's id when
// it is queued, its end when it finishes. So the record is right after a
// restart too, when no firing of this process waits for the run.
func noteScheduledRun(tx *bolt.Tx, r Run) error {
	if r.Schedule == "" {
		return nil
	}
	return updateScheduleRecord(tx, r.Schedule, func(rec *schedules.Record) bool {
		switch {
		case r.State == StateQueued && r.Attempts == 0 && rec.RunID != r.ID:
			rec.RunID = r.ID
			if rec.LastState != schedules.StateRunning || rec.LastStart.IsZero() {
				rec.LastStart, rec.LastEnd, rec.LastState, rec.LastDetail = r.CreatedAt, time.Time{}, schedules.StateRunning, ""
			}
			return true
		case Finished(r.State) && rec.RunID == r.ID:
			rec.LastEnd = r.FinishedAt
			rec.LastState, rec.LastDetail = scheduledOutcome(r)
			return true
		}
		return false
	})
}

// scheduledOutcome is how a finished run leaves its job: succeeded, or
// failed with why.
func scheduledOutcome(r Run) (schedules.State, string) {
	if r.State == StateSucceeded {
		return schedules.StateSucceeded, ""
	}
	return schedules.StateFailed, fmt.Sprintf("run %s %s: %s", r.ID, r.State, r.Reason)
}
