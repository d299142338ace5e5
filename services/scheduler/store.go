package scheduler

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
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
	bucketHistory    = []byte("history")
	bucketSummaries  = []byte("summaries")
	bucketByState    = []byte("by_state")
	bucketByAgent    = []byte("by_agent")
	bucketQuarantine = []byte("quarantine")

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

// states lists every run state; finishedStates the final ones.
var (
	states         = []string{StateQueued, StateRunning, StateSucceeded, StateFailed, StateCanceled}
	finishedStates = []string{StateSucceeded, StateFailed, StateCanceled}
)

// Finished reports whether state is final.
func Finished(state string) bool {
	return state == StateSucceeded || state == StateFailed || state == StateCanceled
}

// Run is one message's way through the scheduler, as stored in runs/.
type Run struct {
	ID          string `json:"id"`
	MessageID   string `json:"message_id"`
	Agent       string `json:"agent"`
	Connector   string `json:"connector,omitempty"`
	Channel     string `json:"channel,omitempty"`
	ChannelName string `json:"channel_name,omitempty"`
	Thread      string `json:"thread,omitempty"`
	Author      string `json:"author,omitempty"`
	Text        string `json:"text,omitempty"`
	// Files are the message's attachments (files.go).
	Files     []RunFile       `json:"files,omitempty"`
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"` // short, user-facing: "timeout", "agent crashed", ...
	Reply     string          `json:"reply,omitempty"`
	Error     string          `json:"error,omitempty"` // the whole story, for admins
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	// MCP is how each of the agent's MCP servers fared in the run: its
	// tools, or why it gave none.
	MCP        []agentproto.MCPStatus `json:"mcp,omitempty"`
	StderrTail string                 `json:"stderr_tail,omitempty"`
	// Egress is what the run's egress proxy decided, as far as the record
	// keeps it (the first and last decisions and the refusals;
	// EgressDropped says how many more); EgressCounts counts every one.
	Egress        []isolation.EgressDecision `json:"egress,omitempty"`
	EgressDropped int                        `json:"egress_dropped,omitempty"`
	EgressCounts  *isolation.EgressCounts    `json:"egress_counts,omitempty"`
	Backend       string                     `json:"backend,omitempty"`
	Handle        string                     `json:"handle,omitempty"` // from Backend OnStart; Kill understands it
	Attempts      int                        `json:"attempts"`         // starts not handed back by a graceful stop
	CreatedAt     time.Time                  `json:"created_at"`
	StartedAt     time.Time                  `json:"started_at,omitzero"`
	FinishedAt    time.Time                  `json:"finished_at,omitzero"`
	Delivered     bool                       `json:"delivered"`
	Seq           uint64                     `json:"seq"` // key in queue/

	// ReadyAt is when the run's sandbox was started and its handle
	// recorded, before its agent read the request (the start stage of
	// berth_scheduler_run_stage_seconds); zero in a conversation sandbox.
	ReadyAt time.Time `json:"ready_at,omitzero"`

	// Schedule is the [[schedules]] job that fired the run; empty for a
	// message's run.
	Schedule string `json:"schedule,omitempty"`
	// Model and MaxRuntimeSeconds are the job's model and max_runtime the
	// run was queued with (schedule_run.go); empty: the agent's.
	Model             string `json:"model,omitempty"`
	MaxRuntimeSeconds int64  `json:"max_runtime_seconds,omitempty"`

	// Attempt numbers the run's latest start (1, 2, …) and is never handed
	// back: committed with the claim, before the start makes anything, it
	// names what that start leaves on the host (isolation.AttemptName), so
	// the sweep tells a dead attempt's sandbox from the live one's.
	Attempt int `json:"attempt,omitempty"`

	// Sandbox is the conversation sandbox the run ran in (sandboxes.go),
	// and SandboxNote why it waited, or why a sandbox was stopped for it or
	// after it.
	Sandbox     string `json:"sandbox,omitempty"`
	SandboxNote string `json:"sandbox_note,omitempty"`

	// Usage is what the run's provider calls spent, as its egress proxy
	// read it (usage.go); nil without calls.
	Usage *egresspolicy.Usage `json:"usage,omitempty"`

	// Traceparent is the W3C trace context of the message's hand-off, the
	// parent of the run's spans (tracing.go), empty for a message that was
	// not traced; TraceID its trace when it is sampled (exported).
	Traceparent string `json:"traceparent,omitempty"`
	TraceID     string `json:"trace_id,omitempty"`

	// ReplyFiles are the files the reply carries, stored under
	// reply-files/<id>/ (replyfiles.go) until intake has them.
	ReplyFiles []ReplyFile `json:"reply_files,omitempty"`
}

// Summary is what ListRuns returns of a run, stored in summaries/ so that a
// list never reads (or decodes) full texts and tool outputs.
type Summary struct {
	ID           string    `json:"id"`
	MessageID    string    `json:"message_id"`
	Agent        string    `json:"agent"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	Connector    string    `json:"connector,omitempty"`
	Channel      string    `json:"channel,omitempty"`
	Thread       string    `json:"thread,omitempty"`
	Author       string    `json:"author,omitempty"`
	Attempts     int       `json:"attempts"`
	Backend      string    `json:"backend,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	FinishedAt   time.Time `json:"finished_at,omitzero"`
	Delivered    bool      `json:"delivered"`
	TextPreview  string    `json:"text_preview,omitempty"`
	ReplyPreview string    `json:"reply_preview,omitempty"`
	TextBytes    int       `json:"text_bytes"`
	ReplyBytes   int       `json:"reply_bytes"`
	// Schedule is the [[schedules]] job that fired the run ("" for a
	// message's run, and for runs recorded before summaries had it).
	Schedule string `json:"schedule,omitempty"`
}

// previewChars bounds text_preview and reply_preview (in characters).
const previewChars = 200

// summaryOf is r's Summary.
func summaryOf(r Run) Summary {
	return Summary{
		ID: r.ID, MessageID: r.MessageID, Agent: r.Agent, State: r.State, Reason: r.Reason,
		Connector: r.Connector, Channel: r.Channel, Thread: r.Thread, Author: r.Author,
		Attempts: r.Attempts, Backend: r.Backend,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, Delivered: r.Delivered,
		TextPreview: preview(r.Text), ReplyPreview: preview(r.Reply),
		TextBytes: len(r.Text), ReplyBytes: len(r.Reply),
		Schedule: r.Schedule,
	}
}

// preview is the first previewChars characters of s.
func preview(s string) string {
	n := 0
	for i := range s {
		if n == previewChars {
			return s[:i]
		}
		n++
	}
	return s
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
	{Version: 3, Apply: migrateIndexes},
}

// schemaVersion is the version this build writes.
func schemaVersion() int { return migrations[len(migrations)-1].Version }

// migrateIndexes (schema version 3) adds summaries/, by_state/, by_agent/
// and quarantine/, and fills the first three from runs/. A run that cannot be
// decoded is quarantined instead of failing the migration.
func migrateIndexes(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketSummaries, bucketByState, bucketByAgent, bucketQuarantine} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("cannot create bucket %s: %w", name, err)
		}
	}
	var bad [][]byte
	var good []Run
	flush := func() error {
		for _, r := range good {
			if err := indexRun(tx, r); err != nil {
				return err
			}
		}
		good = good[:0]
		return nil
	}
	err := runsBucket(tx).ForEach(func(k, v []byte) error {
		var r Run
		if err := json.Unmarshal(v, &r); err != nil || r.ID != string(k) {
			bad = append(bad, bytes.Clone(k))
			return nil
		}
		good = append(good, r)
		if len(good) == 1000 {
			// Index buckets are not runs/: writing them while walking is safe.
			return flush()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cannot index runs: %w", err)
	}
	if err := flush(); err != nil {
		return fmt.Errorf("cannot index runs: %w", err)
	}
	for _, k := range bad {
		if err := quarantineRecord(tx, bucketRuns, k, "undecodable run record found while indexing (schema version 3)", time.Time{}); err != nil {
			return err
		}
	}
	return nil
}

// indexRun writes r's summary and index entries (used by the migration,
// where none exist yet).
func indexRun(tx *bolt.Tx, r Run) error {
	data, err := json.Marshal(summaryOf(r))
	if err != nil {
		return fmt.Errorf("cannot encode summary of run %s: %w", r.ID, err)
	}
	if err := summariesBucket(tx).Put([]byte(r.ID), data); err != nil {
		return fmt.Errorf("cannot store summary of run %s: %w", r.ID, err)
	}
	if err := byStateBucket(tx).Put(indexKey(r.State, r.ID), nil); err != nil {
		return fmt.Errorf("cannot index run %s by state: %w", r.ID, err)
	}
	if err := byAgentBucket(tx).Put(indexKey(r.Agent, r.ID), nil); err != nil {
		return fmt.Errorf("cannot index run %s by agent: %w", r.ID, err)
	}
	return nil
}

// store is scheduler.db.
type store struct {
	db *bolt.DB
	w  *boltstore.Committer // the busy paths' writes (boltstore.Committer)
	// updates counts the commits of update: the writes that keep a
	// transaction of their own.
	updates atomic.Uint64
}

// openStore opens (creating and migrating) path. A second opener fails after
// one second instead of waiting for the lock forever.
func openStore(path string) (*store, error) {
	db, err := boltstore.Open(path, "berth-scheduler", migrations)
	if err != nil {
		return nil, err
	}
	return &store{db: db, w: boltstore.NewCommitter(db)}, nil
}

// close commits the writes queued, then closes the file.
func (s *store) close() error {
	s.w.Close()
	return s.db.Close()
}

// write runs fn in a transaction shared with the other writes that arrive
// while a commit is under way, and returns once it is committed; see
// boltstore.Committer.Write for what fn must allow.
func (s *store) write(fn func(*bolt.Tx) error) error { return s.w.Write(fn) }

// update runs fn in a transaction of its own: for the rare and the large
// writes (reconcile, quarantine, retention), which would only slow a group.
func (s *store) update(fn func(*bolt.Tx) error) error {
	err := s.db.Update(fn)
	if err == nil {
		s.updates.Add(1)
	}
	return err
}

// commits is the number of commits this store has made: grouped and on
// their own.
func (s *store) commits() uint64 {
	commits, _ := s.w.Stats()
	return commits + s.updates.Load()
}

// groupCommits is the number of commits of write alone.
func (s *store) groupCommits() uint64 {
	commits, _ := s.w.Stats()
	return commits
}

func u64(v uint64) []byte { return boltstore.U64(v) }

func runsBucket(tx *bolt.Tx) *bolt.Bucket       { return tx.Bucket(bucketRuns) }
func messagesBucket(tx *bolt.Tx) *bolt.Bucket   { return tx.Bucket(bucketMessages) }
func queueBucket(tx *bolt.Tx) *bolt.Bucket      { return tx.Bucket(bucketQueue) }
func deliveriesBucket(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket(bucketDeliveries) }
func historyBucket(tx *bolt.Tx) *bolt.Bucket    { return tx.Bucket(bucketHistory) }
func summariesBucket(tx *bolt.Tx) *bolt.Bucket  { return tx.Bucket(bucketSummaries) }
func byStateBucket(tx *bolt.Tx) *bolt.Bucket    { return tx.Bucket(bucketByState) }
func byAgentBucket(tx *bolt.Tx) *bolt.Bucket    { return tx.Bucket(bucketByAgent) }
func quarantineBucket(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket(bucketQuarantine) }

// indexKey is a by_state/ or by_agent/ key: the value, NUL, the run id (no
// state, agent id or run id contains NUL).
func indexKey(value, id string) []byte { return []byte(value + "\x00" + id) }

// corruptRecord is a value that cannot be decoded. Readers skip it and the
// service moves it to quarantine/ (Service.setAside).
type corruptRecord struct {
	bucket []byte
	key    []byte
	err    error
}

func (e *corruptRecord) Error() string {
	return fmt.Sprintf("cannot decode %s/%s: %v", e.bucket, e.key, e.err)
}

func (e *corruptRecord) Unwrap() error { return e.err }

// asCorrupt returns the corrupt record in err's chain, if any.
func asCorrupt(err error) (*corruptRecord, bool) {
	var c *corruptRecord
	ok := errors.As(err, &c)
	return c, ok
}

// getRun reads one run; ok is false when there is none. An undecodable
// record is a *corruptRecord error.
func getRun(tx *bolt.Tx, id string) (Run, bool, error) {
	v := runsBucket(tx).Get([]byte(id))
	if v == nil {
		return Run{}, false, nil
	}
	var r Run
	if err := json.Unmarshal(v, &r); err != nil {
		return Run{}, false, &corruptRecord{bucket: bucketRuns, key: []byte(id), err: err}
	}
	return r, true, nil
}

// getSummary reads one run's summary; ok is false when there is none.
func getSummary(tx *bolt.Tx, id []byte) (Summary, bool, error) {
	v := summariesBucket(tx).Get(id)
	if v == nil {
		return Summary{}, false, nil
	}
	var sum Summary
	if err := json.Unmarshal(v, &sum); err != nil {
		return Summary{}, false, &corruptRecord{bucket: bucketSummaries, key: bytes.Clone(id), err: err}
	}
	return sum, true, nil
}

// putRun writes r and keeps summaries/, the indexes, queue/ and deliveries/
// in step with it. The old summary (small) says which index entries to move.
func putRun(tx *bolt.Tx, r Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("cannot encode run %s: %w", r.ID, err)
	}
	id := []byte(r.ID)
	appendOnly(tx)
	old, hadOld, oldErr := getSummary(tx, id)
	if err := runsBucket(tx).Put(id, data); err != nil {
		return fmt.Errorf("cannot store run %s: %w", r.ID, err)
	}
	switch {
	case oldErr != nil:
		// The summary is what is broken; the record replaces it.
		if err := unindexRun(tx, r.ID, ""); err != nil {
			return err
		}
	case hadOld:
		if old.State != r.State {
			if err := byStateBucket(tx).Delete(indexKey(old.State, r.ID)); err != nil {
				return fmt.Errorf("cannot update state index of run %s: %w", r.ID, err)
			}
		}
		if old.Agent != r.Agent {
			if err := byAgentBucket(tx).Delete(indexKey(old.Agent, r.ID)); err != nil {
				return fmt.Errorf("cannot update agent index of run %s: %w", r.ID, err)
			}
		}
	}
	if err := indexRun(tx, r); err != nil {
		return err
	}
	seq := u64(r.Seq)
	if r.State == StateQueued {
		err = queueBucket(tx).Put(seq, id)
	} else if q := queueBucket(tx).Get(seq); q != nil && string(q) == r.ID {
		err = queueBucket(tx).Delete(seq)
	}
	if err != nil {
		return fmt.Errorf("cannot update queue for run %s: %w", r.ID, err)
	}
	if Finished(r.State) && !r.Delivered {
		err = deliveriesBucket(tx).Put(id, nil)
	} else {
		err = deliveriesBucket(tx).Delete(id)
	}
	if err != nil {
		return fmt.Errorf("cannot update deliveries for run %s: %w", r.ID, err)
	}
	return noteScheduledRun(tx, r)
}

// appendOnly fills pages of the buckets keyed by run id (or prefix and run
// id) to 90% instead of bbolt's 50%: run ids grow with time, so new keys
// come last and a half-filled page would stay half empty.
func appendOnly(tx *bolt.Tx) {
	for _, b := range []*bolt.Bucket{runsBucket(tx), summariesBucket(tx), byStateBucket(tx), byAgentBucket(tx)} {
		b.FillPercent = 0.9
	}
}

// unindexRun removes a run's summary, index entries, queue and delivery
// entries (not runs/ or messages/). agent may be "" when unknown.
func unindexRun(tx *bolt.Tx, id, agent string) error {
	if err := summariesBucket(tx).Delete([]byte(id)); err != nil {
		return fmt.Errorf("cannot remove summary of run %s: %w", id, err)
	}
	for _, st := range states {
		if err := byStateBucket(tx).Delete(indexKey(st, id)); err != nil {
			return fmt.Errorf("cannot remove run %s from the state index: %w", id, err)
		}
	}
	if agent != "" {
		if err := byAgentBucket(tx).Delete(indexKey(agent, id)); err != nil {
			return fmt.Errorf("cannot remove run %s from the agent index: %w", id, err)
		}
	}
	if err := deliveriesBucket(tx).Delete([]byte(id)); err != nil {
		return fmt.Errorf("cannot remove run %s from deliveries: %w", id, err)
	}
	var stale [][]byte
	err := queueBucket(tx).ForEach(func(k, v []byte) error {
		if string(v) == id {
			stale = append(stale, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cannot read queue: %w", err)
	}
	for _, k := range stale {
		if err := queueBucket(tx).Delete(k); err != nil {
			return fmt.Errorf("cannot remove run %s from the queue: %w", id, err)
		}
	}
	return nil
}

// deleteRun removes a finished run and everything that points at it,
// including its message id (retention: a platform retry that late is not
// expected).
func deleteRun(tx *bolt.Tx, sum Summary) error {
	if err := unindexRun(tx, sum.ID, sum.Agent); err != nil {
		return err
	}
	if err := runsBucket(tx).Delete([]byte(sum.ID)); err != nil {
		return fmt.Errorf("cannot delete run %s: %w", sum.ID, err)
	}
	if v := messagesBucket(tx).Get([]byte(sum.MessageID)); v != nil && string(v) == sum.ID {
		if err := messagesBucket(tx).Delete([]byte(sum.MessageID)); err != nil {
			return fmt.Errorf("cannot delete message id of run %s: %w", sum.ID, err)
		}
	}
	return nil
}

// quarantined is a record kept aside in quarantine/.
type quarantined struct {
	Bucket string    `json:"bucket"`
	Key    string    `json:"key"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at,omitzero"`
	Value  []byte    `json:"value"` // the bytes as found (base64 in JSON)
}

// quarantineRecord moves bucket/key to quarantine/ with reason. A run taken
// out of runs/ leaves the indexes, the queue and deliveries too; a broken
// summary is rebuilt from its run when that one is sound.
func quarantineRecord(tx *bolt.Tx, bucket, key []byte, reason string, now time.Time) error {
	b := tx.Bucket(bucket)
	if b == nil {
		return fmt.Errorf("cannot quarantine %s/%s: no such bucket", bucket, key)
	}
	v := b.Get(key)
	if v == nil {
		return nil // already handled
	}
	data, err := json.Marshal(quarantined{Bucket: string(bucket), Key: string(key), Reason: reason, At: now, Value: v})
	if err != nil {
		return fmt.Errorf("cannot encode quarantined %s/%s: %w", bucket, key, err)
	}
	qkey := append(append(bytes.Clone(bucket), '/'), key...)
	for n := 2; quarantineBucket(tx).Get(qkey) != nil; n++ {
		qkey = fmt.Appendf(nil, "%s/%s#%d", bucket, key, n)
	}
	if err := quarantineBucket(tx).Put(qkey, data); err != nil {
		return fmt.Errorf("cannot quarantine %s/%s: %w", bucket, key, err)
	}
	if err := b.Delete(key); err != nil {
		return fmt.Errorf("cannot remove quarantined %s/%s: %w", bucket, key, err)
	}
	switch {
	case bytes.Equal(bucket, bucketRuns):
		agent := ""
		if sum, ok, err := getSummary(tx, key); err == nil && ok {
			agent = sum.Agent
		}
		return unindexRun(tx, string(key), agent)
	case bytes.Equal(bucket, bucketSummaries):
		r, ok, err := getRun(tx, string(key))
		if c, bad := asCorrupt(err); bad {
			return quarantineRecord(tx, c.bucket, c.key, reason+" (its summary was undecodable too)", now)
		}
		if err != nil {
			return err
		}
		if err := unindexRun(tx, string(key), r.Agent); err != nil || !ok {
			return err
		}
		return putRun(tx, r)
	}
	return nil
}

// quarantineCount is the number of records in quarantine/.
func quarantineCount(tx *bolt.Tx) int { return quarantineBucket(tx).Stats().KeyN }

// queuedRunIDs lists the queued runs in FIFO order.
func queuedRunIDs(tx *bolt.Tx) ([]string, error) {
	var ids []string
	err := queueBucket(tx).ForEach(func(_, v []byte) error {
		ids = append(ids, string(v))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read queue: %w", err)
	}
	return ids, nil
}

// pendingDeliveryIDs lists the finished runs intake has not acknowledged.
func pendingDeliveryIDs(tx *bolt.Tx) ([]string, error) {
	var ids []string
	err := deliveriesBucket(tx).ForEach(func(k, _ []byte) error {
		ids = append(ids, string(k))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read deliveries: %w", err)
	}
	return ids, nil
}

// runIDsInState lists the ids of the runs in state, oldest first, reading
// only the state index.
func runIDsInState(tx *bolt.Tx, state string) []string {
	var ids []string
	prefix := indexKey(state, "")
	c := byStateBucket(tx).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		ids = append(ids, string(k[len(prefix):]))
	}
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
