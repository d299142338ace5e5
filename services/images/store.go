package images

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/boltstore"
)

// Bucket names; the package comment draws the tree.
var (
	bucketImages = []byte("images")
	bucketJobs   = []byte("jobs")
)

// migrations are applied in order to databases older than their version.
// Append only; never edit a released entry.
var migrations = []boltstore.Migration{
	{Version: 1, Apply: createV1Buckets},
}

func createV1Buckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketImages, bucketJobs} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return nil
}

// Image statuses.
const (
	StatusBuilding = "building"
	StatusReady    = "ready"
	StatusFailed   = "failed"
)

// Record is what berth knows of one image it built (images/<tag>).
type Record struct {
	Tag      string            `json:"tag"`
	Kind     string            `json:"kind"` // imagectl.KindSandbox or KindIsolated
	Hash     string            `json:"hash"`
	ID       string            `json:"id,omitempty"` // the engine's image ID
	Inputs   map[string]string `json:"inputs,omitempty"`
	Created  time.Time         `json:"created,omitzero"`
	Size     int64             `json:"size,omitempty"`
	LastUsed time.Time         `json:"last_used,omitzero"`
	Status   string            `json:"status"`
	Error    string            `json:"error,omitempty"`
	LogTail  []string          `json:"log_tail,omitempty"`
}

// Job states.
const (
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
	JobCanceled  = "canceled"
)

// JobRecord is one build job (jobs/<id>).
type JobRecord struct {
	ID       uint64    `json:"id"`
	Target   string    `json:"target"`
	State    string    `json:"state"`
	Step     uint32    `json:"step"`
	Total    uint32    `json:"total"`
	Tag      string    `json:"tag,omitempty"`
	Error    string    `json:"error,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
}

// keptJobs is how many finished jobs images.db keeps.
const keptJobs = 100

// store is images.db.
type store struct {
	db *bolt.DB
}

func openStore(path string) (*store, error) {
	db, err := boltstore.Open(path, "berth-imaged", migrations)
	if err != nil {
		return nil, err
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

// putImage writes a record (fsynced before it returns).
func (s *store) putImage(r Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("cannot encode image record: %w", err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketImages).Put([]byte(r.Tag), data)
	}); err != nil {
		return fmt.Errorf("cannot store image record %s: %w", r.Tag, err)
	}
	return nil
}

// updateImage changes an existing record; a missing one is ErrNoRecord.
func (s *store) updateImage(tag string, change func(*Record)) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketImages)
		data := b.Get([]byte(tag))
		if data == nil {
			return errNoRecord
		}
		var r Record
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("cannot decode image record %s: %w", tag, err)
		}
		change(&r)
		out, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return b.Put([]byte(tag), out)
	})
	if err != nil && !errors.Is(err, errNoRecord) {
		return fmt.Errorf("cannot update image record %s: %w", tag, err)
	}
	return err
}

var errNoRecord = errors.New("no such image record")

func (s *store) image(tag string) (Record, bool, error) {
	var r Record
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		data := tx.Bucket(bucketImages).Get([]byte(tag))
		if data == nil {
			return nil
		}
		found = true
		return json.Unmarshal(data, &r)
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("cannot read image record %s: %w", tag, err)
	}
	return r, found, nil
}

// images lists every record in tag order. An undecodable record is skipped
// and reported, never fatal to the list.
func (s *store) images() ([]Record, []error, error) {
	var out []Record
	var bad []error
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketImages).ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				bad = append(bad, fmt.Errorf("image record %s is undecodable: %w", k, err))
				return nil
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cannot list image records: %w", err)
	}
	return out, bad, nil
}

func (s *store) deleteImage(tag string) error {
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketImages).Delete([]byte(tag))
	}); err != nil {
		return fmt.Errorf("cannot delete image record %s: %w", tag, err)
	}
	return nil
}

func (s *store) countImages() (int, error) {
	var n int
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketImages).Stats().KeyN
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cannot count image records: %w", err)
	}
	return n, nil
}

// newJob stores a running job under the next id and returns it.
func (s *store) newJob(target string, now time.Time) (JobRecord, error) {
	var j JobRecord
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		id, err := b.NextSequence()
		if err != nil {
			return err
		}
		j = JobRecord{ID: id, Target: target, State: JobRunning, Started: now}
		return putJob(b, j)
	})
	if err != nil {
		return JobRecord{}, fmt.Errorf("cannot store build job: %w", err)
	}
	return j, nil
}

// finishJob records a job's end and drops the oldest finished jobs beyond
// keptJobs.
func (s *store) finishJob(j JobRecord) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		if err := putJob(b, j); err != nil {
			return err
		}
		for n := b.Stats().KeyN; n > keptJobs; n-- {
			k, _ := b.Cursor().First()
			if k == nil {
				break
			}
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cannot store build job %d: %w", j.ID, err)
	}
	return nil
}

// interruptLeftovers ends what a previous process left running: jobs become
// failed and building records failed, both "interrupted".
func (s *store) interruptLeftovers(now time.Time) (int, error) {
	var n int
	err := s.db.Update(func(tx *bolt.Tx) error {
		jobs := tx.Bucket(bucketJobs)
		var ended []JobRecord
		if err := jobs.ForEach(func(_, v []byte) error {
			var j JobRecord
			if json.Unmarshal(v, &j) == nil && j.State == JobRunning {
				j.State, j.Error, j.Finished = JobFailed, "interrupted: berth-imaged stopped during the build", now
				ended = append(ended, j)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, j := range ended {
			if err := putJob(jobs, j); err != nil {
				return err
			}
		}
		imgs := tx.Bucket(bucketImages)
		var stale []Record
		if err := imgs.ForEach(func(_, v []byte) error {
			var r Record
			if json.Unmarshal(v, &r) == nil && r.Status == StatusBuilding {
				r.Status, r.Error = StatusFailed, "interrupted: berth-imaged stopped during the build"
				stale = append(stale, r)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, r := range stale {
			data, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := imgs.Put([]byte(r.Tag), data); err != nil {
				return err
			}
		}
		n = len(ended) + len(stale)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cannot end interrupted builds: %w", err)
	}
	return n, nil
}

func putJob(b *bolt.Bucket, j JobRecord) error {
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	return b.Put(boltstore.U64(j.ID), data)
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
