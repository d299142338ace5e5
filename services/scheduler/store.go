package scheduler

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/boltstore"

	bolt "go.etcd.io/bbolt"
)

// DBName is the file name of the store inside the state directory.
const DBName = "scheduler.db"

// Bucket and key names; the tree is drawn in the package comment.
var (
	bucketMeta       = []byte("meta")
	bucketRuns       = []byte("runs")
	bucketMessages   = []byte("messages")
	bucketQueue      = []byte("queue")
	bucketDeliveries = []byte("deliveries")

	keyVersion = []byte("version") // written by boltstore
)

// Run states.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCanceled  = "canceled"
)

// Finished reports whether state is final.
func Finished(state string) bool {
	return state == StateSucceeded || state == StateFailed || state == StateCanceled
}

// Run is one message's way through the scheduler, as stored in runs/.
type Run struct {
	ID          string          `json:"id"`
	MessageID   string          `json:"message_id"`
	Agent       string          `json:"agent"`
	Connector   string          `json:"connector,omitempty"`
	Channel     string          `json:"channel,omitempty"`
	ChannelName string          `json:"channel_name,omitempty"`
	Thread      string          `json:"thread,omitempty"`
	Author      string          `json:"author,omitempty"`
	Text        string          `json:"text,omitempty"`
	State       string          `json:"state"`
	Reason      string          `json:"reason,omitempty"` // short, user-facing: "timeout", "agent crashed", ...
	Reply       string          `json:"reply,omitempty"`
	Error       string          `json:"error,omitempty"` // the whole story, for admins
	ToolCalls   json.RawMessage `json:"tool_calls,omitempty"`
	StderrTail  string          `json:"stderr_tail,omitempty"`
	Backend     string          `json:"backend,omitempty"`
	Handle      string          `json:"handle,omitempty"` // from Backend OnStart; Kill understands it
	Attempts    int             `json:"attempts"`         // starts not handed back by a graceful stop
	CreatedAt   time.Time       `json:"created_at"`
	StartedAt   time.Time       `json:"started_at,omitzero"`
	FinishedAt  time.Time       `json:"finished_at,omitzero"`
	Delivered   bool            `json:"delivered"`
	Seq         uint64          `json:"seq"` // key in queue/
}

// migrations are applied in order; append, never edit a released one.
var migrations = []boltstore.Migration{
	{Version: 1, Apply: func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketRuns, bucketMessages, bucketQueue, bucketDeliveries} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("cannot create bucket %s: %w", name, err)
			}
		}
		return nil
	}},
	{Version: 2, Apply: migrateHistory},
}

// schemaVersion is the version this build writes.
func schemaVersion() int { return migrations[len(migrations)-1].Version }

// store is scheduler.db.
type store struct {
	db *bolt.DB
}

// openStore opens (creating and migrating) path. A second opener fails after
// one second instead of waiting for the lock forever.
func openStore(path string) (*store, error) {
	db, err := boltstore.Open(path, "berth-scheduler", migrations)
	if err != nil {
		return nil, err
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

func u64(v uint64) []byte { return boltstore.U64(v) }

func runsBucket(tx *bolt.Tx) *bolt.Bucket       { return tx.Bucket(bucketRuns) }
func messagesBucket(tx *bolt.Tx) *bolt.Bucket   { return tx.Bucket(bucketMessages) }
func queueBucket(tx *bolt.Tx) *bolt.Bucket      { return tx.Bucket(bucketQueue) }
func deliveriesBucket(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket(bucketDeliveries) }

// getRun reads one run; ok is false when there is none.
func getRun(tx *bolt.Tx, id string) (Run, bool, error) {
	v := runsBucket(tx).Get([]byte(id))
	if v == nil {
		return Run{}, false, nil
	}
	var r Run
	if err := json.Unmarshal(v, &r); err != nil {
		return Run{}, false, fmt.Errorf("cannot decode run %s: %w", id, err)
	}
	return r, true, nil
}

// putRun writes r and keeps queue/ and deliveries/ in step with its state.
func putRun(tx *bolt.Tx, r Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("cannot encode run %s: %w", r.ID, err)
	}
	if err := runsBucket(tx).Put([]byte(r.ID), data); err != nil {
		return fmt.Errorf("cannot store run %s: %w", r.ID, err)
	}
	seq := u64(r.Seq)
	if r.State == StateQueued {
		err = queueBucket(tx).Put(seq, []byte(r.ID))
	} else if q := queueBucket(tx).Get(seq); q != nil && string(q) == r.ID {
		err = queueBucket(tx).Delete(seq)
	}
	if err != nil {
		return fmt.Errorf("cannot update queue for run %s: %w", r.ID, err)
	}
	if Finished(r.State) && !r.Delivered {
		err = deliveriesBucket(tx).Put([]byte(r.ID), nil)
	} else {
		err = deliveriesBucket(tx).Delete([]byte(r.ID))
	}
	if err != nil {
		return fmt.Errorf("cannot update deliveries for run %s: %w", r.ID, err)
	}
	return nil
}

// queuedRunIDs lists the queued runs in FIFO order.
func queuedRunIDs(tx *bolt.Tx) []string {
	var ids []string
	_ = queueBucket(tx).ForEach(func(_, v []byte) error {
		ids = append(ids, string(v))
		return nil
	})
	return ids
}

// pendingDeliveryIDs lists the finished runs intake has not acknowledged.
func pendingDeliveryIDs(tx *bolt.Tx) []string {
	var ids []string
	_ = deliveriesBucket(tx).ForEach(func(k, _ []byte) error {
		ids = append(ids, string(k))
		return nil
	})
	return ids
}

// newRunID returns a unique id that sorts by creation time and is a valid
// D-Bus object path element ([A-Za-z0-9_]).
func newRunID(now time.Time) string {
	var random [5]byte
	_, _ = rand.Read(random[:])
	now = now.UTC()
	return fmt.Sprintf("%s_%09d_%s", now.Format("20060102T150405"), now.Nanosecond(), hex.EncodeToString(random[:]))
}
