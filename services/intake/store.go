package intake

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/services/intake/connector"

	bolt "go.etcd.io/bbolt"
)

// Bucket and key names; the package comment draws the tree.
var (
	bucketMeta     = []byte("meta")
	keySchema      = []byte("version") // written by boltstore
	bucketInbox    = []byte("inbox")
	bucketOutbox   = []byte("outbox")
	bucketMessages = []byte("messages")
	bucketReplies  = []byte("replies")
	bucketPending  = []byte("pending")
	bucketDone     = []byte("done")
)

// Entry states (the state field).
const (
	statePending   = "pending"
	stateSubmitted = "submitted"
	stateRefused   = "refused" // the scheduler refused it for good; an error reply was queued
	stateDecided   = "decided" // a decision on an approval (approvals.go), answered by the scheduler
	stateDelivered = "delivered"
	stateFailed    = "failed" // the platform refused the reply for good
)

// inboxEntry is an accepted chat message (inbox/messages). It is also the
// message id's de-duplication record: while it is kept, the same
// (connector, id) is acknowledged and runs nothing again.
type inboxEntry struct {
	Connector   string `json:"connector"`
	ID          string `json:"id"`
	Channel     string `json:"channel"`
	ChannelName string `json:"channel_name,omitempty"`
	Server      string `json:"server,omitempty"`
	Thread      string `json:"thread,omitempty"`
	Author      string `json:"author"`
	// AuthorID is the platform's stable id of the author ("" for a bot):
	// who decides, for a Decision.
	AuthorID string `json:"author_id,omitempty"`
	// AuthorGroups are the platform's ids of the author's groups.
	AuthorGroups []string          `json:"author_groups,omitempty"`
	Text         string            `json:"text"`
	Meta         map[string]string `json:"meta,omitempty"`
	Agent        string            `json:"agent"`
	ReceivedAt   time.Time         `json:"received_at"`
	State        string            `json:"state"`
	RunID        string            `json:"run_id,omitempty"`
	Attempts     int               `json:"attempts,omitempty"`
	LastError    string            `json:"last_error,omitempty"`
	DoneAt       time.Time         `json:"done_at,omitzero"`
	Seq          uint64            `json:"seq"`
	// ProgressMessage is the platform id of the run's progress message
	// (progress.go), deleted once the reply is posted.
	ProgressMessage string `json:"progress_message,omitempty"`
	// Traceparent is the W3C trace context of the message's store span,
	// the parent of its hand-offs (tracing.go); "" when not traced.
	Traceparent string `json:"traceparent,omitempty"`
	// Files are the message's attachments, kept under fileDir(Key()) while
	// the message is pending (attachments.go).
	Files []storedFile `json:"files,omitempty"`
	// Refusal is the reply to a message whose files could not be taken: it
	// runs nothing, its sender is told why.
	Refusal string `json:"refusal,omitempty"`
	// Decision makes the message a person's answer to an approval
	// (approvals.go): it runs nothing.
	Decision *connector.Decision `json:"decision,omitempty"`
}

// Key is the message's inbox key and the scheduler's idempotency key.
func (m inboxEntry) Key() string { return busapi.MessageKey(m.Connector, m.ID) }

// outboxEntry is an agent's reply (outbox/replies), waiting to be sent by its
// connector.
type outboxEntry struct {
	RunID       string            `json:"run_id"`
	MessageID   string            `json:"message_id"`
	Connector   string            `json:"connector"`
	Agent       string            `json:"agent,omitempty"`
	Channel     string            `json:"channel,omitempty"`
	Thread      string            `json:"thread,omitempty"`
	Meta        map[string]string `json:"meta,omitempty"`
	RunState    string            `json:"run_state,omitempty"`
	Text        string            `json:"text,omitempty"`
	Error       string            `json:"error,omitempty"`
	State       string            `json:"state"`
	Attempts    int               `json:"attempts,omitempty"`
	LastError   string            `json:"last_error,omitempty"`
	NextAttempt time.Time         `json:"next_attempt,omitzero"`
	// AttemptedAt is when the first attempt began, written before it for
	// connectors that check for reposts: set and not delivered means a
	// crash may have come between the post and markDelivered.
	AttemptedAt time.Time `json:"attempted_at,omitzero"`
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
	DoneAt      time.Time `json:"done_at,omitzero"`
	Seq         uint64    `json:"seq"`
	// Traceparent is the W3C trace context of the scheduler's delivery
	// span, the parent of each send's span (tracing.go); "" when not traced.
	Traceparent string `json:"traceparent,omitempty"`
	// FilesDir is the reply's directory under reply-files/ (replyfiles.go)
	// and Files its files, in order; both empty for a reply without files.
	FilesDir string       `json:"files_dir,omitempty"`
	Files    []storedFile `json:"files,omitempty"`
	// Question makes the reply an approval's question (the platform shows
	// its choices as buttons where it has them).
	Question *busapi.Question `json:"question,omitempty"`
}

// migrations are applied in order to databases older than their version.
// Append only; never edit a released entry.
var migrations = []boltstore.Migration{
	{Version: 1, Apply: createV1Buckets},
	{Version: 2, Apply: addDoneIndexes},
}

func schemaVersion() int { return migrations[len(migrations)-1].Version }

func createV1Buckets(tx *bolt.Tx) error {
	for _, path := range [][][]byte{
		{bucketInbox, bucketMessages},
		{bucketInbox, bucketPending},
		{bucketOutbox, bucketReplies},
		{bucketOutbox, bucketPending},
	} {
		parent, err := tx.CreateBucketIfNotExists(path[0])
		if err != nil {
			return err
		}
		if _, err := parent.CreateBucketIfNotExists(path[1]); err != nil {
			return err
		}
	}
	return nil
}

// addDoneIndexes (version 2) adds inbox/done and outbox/done, the finished
// entries in the order they finished, which retention prunes from the oldest;
// entries finished under version 1 are indexed at the time they arrived
// (inbox) or were delivered (outbox). It also keys the pending indexes by
// connector and then sequence number (pendingKey), so that each connector's
// worker reads only its own range.
func addDoneIndexes(tx *bolt.Tx) error {
	for _, top := range [][]byte{bucketInbox, bucketOutbox} {
		if _, err := tx.Bucket(top).CreateBucketIfNotExists(bucketDone); err != nil {
			return err
		}
	}
	if err := rekeyPending[inboxEntry](inboxQueue(tx)); err != nil {
		return err
	}
	if err := rekeyPending[outboxEntry](outboxQueue(tx)); err != nil {
		return err
	}
	messages, _, inDone := inboxBuckets(tx)
	err := messages.ForEach(func(k, v []byte) error {
		var m inboxEntry
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("inbox entry %q: %w", k, err)
		}
		if m.State == statePending {
			return nil
		}
		return inDone.Put(doneKey(m.ReceivedAt, m.Seq), bytes.Clone(k))
	})
	if err != nil {
		return err
	}
	replies, _, outDone := outboxBuckets(tx)
	return replies.ForEach(func(k, v []byte) error {
		var r outboxEntry
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("outbox entry %q: %w", k, err)
		}
		if r.State == statePending {
			return nil
		}
		return outDone.Put(doneKey(r.DeliveredAt, r.Seq), bytes.Clone(k))
	})
}

// rekeyPending rewrites a version 1 pending index (<seq> : key) as
// <connector> NUL <seq> : key.
func rekeyPending[E queued](q queue) error {
	type move struct{ old, new, key []byte }
	var moves []move
	err := q.pending.ForEach(func(k, key []byte) error {
		v := q.items.Get(key)
		if v == nil {
			return fmt.Errorf("pending index names missing entry %q", key)
		}
		var e E
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("entry %q: %w", key, err)
		}
		_, connector, seq, _, _ := entryFields(&e)
		moves = append(moves, move{bytes.Clone(k), pendingKey(connector, *seq), bytes.Clone(key)})
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range moves {
		if err := q.pending.Delete(m.old); err != nil {
			return err
		}
		if err := q.pending.Put(m.new, m.key); err != nil {
			return err
		}
	}
	return nil
}

// doneKey sorts finished entries by the time they finished, then by seq.
func doneKey(at time.Time, seq uint64) []byte {
	k := make([]byte, 16)
	ns := at.UnixNano()
	if at.IsZero() || ns < 0 {
		ns = 0
	}
	binary.BigEndian.PutUint64(k, uint64(ns))
	binary.BigEndian.PutUint64(k[8:], seq)
	return k
}

func doneKeyTime(k []byte) time.Time {
	if len(k) < 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(k)))
}

// store is intake.db. It is safe for concurrent use; every write goes
// through one group committer.
type store struct {
	db *bolt.DB
	w  *boltstore.Committer // every write goes through it
	// The pending counts, changed by each commit (tx.OnCommit) so that the
	// D-Bus counters and the idle check never walk the pending indexes.
	inboxPending, outboxPending atomic.Int64
}

// openStore opens (creating and migrating when needed) the database at path.
// A second opener gives up after a second instead of waiting forever.
func openStore(path string) (*store, error) {
	db, err := boltstore.Open(path, "berth-intake", migrations)
	if err != nil {
		return nil, err
	}
	s := &store{db: db, w: boltstore.NewCommitter(db)}
	err = db.View(func(tx *bolt.Tx) error {
		_, in, _ := inboxBuckets(tx)
		_, out, _ := outboxBuckets(tx)
		s.inboxPending.Store(int64(in.Stats().KeyN))
		s.outboxPending.Store(int64(out.Stats().KeyN))
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("cannot count pending entries: %w", err)
	}
	return s, nil
}

// Close commits the writes already queued and closes the database; a
// second Close is harmless.
func (s *store) Close() error {
	s.w.Close()
	return s.db.Close()
}

// write runs fn in a transaction shared with concurrent writers and returns
// once it is committed (see boltstore.Committer.Write).
func (s *store) write(fn func(*bolt.Tx) error) error { return s.w.Write(fn) }

// commitStats returns how many commits (fsyncs) the store made and how many
// writes they held.
func (s *store) commitStats() (commits, writes uint64) {
	return s.w.Stats()
}

func u64(v uint64) []byte { return boltstore.U64(v) }

func inboxBuckets(tx *bolt.Tx) (messages, pending, done *bolt.Bucket) {
	inbox := tx.Bucket(bucketInbox)
	return inbox.Bucket(bucketMessages), inbox.Bucket(bucketPending), inbox.Bucket(bucketDone)
}

func outboxBuckets(tx *bolt.Tx) (replies, pending, done *bolt.Bucket) {
	outbox := tx.Bucket(bucketOutbox)
	return outbox.Bucket(bucketReplies), outbox.Bucket(bucketPending), outbox.Bucket(bucketDone)
}

// message returns the inbox entry of connector/id.
func (s *store) message(connector, id string) (inboxEntry, bool, error) {
	var m inboxEntry
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		messages, _, _ := inboxBuckets(tx)
		v := messages.Get([]byte(busapi.MessageKey(connector, id)))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &m)
	})
	if err != nil {
		return inboxEntry{}, false, fmt.Errorf("cannot read inbox: %w", err)
	}
	return m, found, nil
}

// queued is an inbox or outbox entry: stored under its key, listed in the
// pending index under its sequence number while its state is pending, and in
// the done index once it is not.
type queued interface {
	inboxEntry | outboxEntry
}

// entryFields returns the bucket key of an entry and the fields the indexes
// need.
func entryFields[E queued](e *E) (key []byte, connector string, seq *uint64, state *string, doneAt *time.Time) {
	switch e := any(e).(type) {
	case *inboxEntry:
		return []byte(e.Key()), e.Connector, &e.Seq, &e.State, &e.DoneAt
	case *outboxEntry:
		return []byte(e.RunID), e.Connector, &e.Seq, &e.State, &e.DoneAt
	}
	panic("unreachable")
}

// pendingKey is an entry's key in its pending index: its connector, a NUL
// (connector ids never hold one), and its sequence number, so that each
// connector's pending entries are one range in arrival order.
func pendingKey(connector string, seq uint64) []byte {
	k := make([]byte, 0, len(connector)+9)
	k = append(k, connector...)
	k = append(k, 0)
	return append(k, u64(seq)...)
}

// pendingPrefix is the start of a connector's range in a pending index.
func pendingPrefix(connector string) []byte { return append([]byte(connector), 0) }

// queue is one side of the store (inbox or outbox) inside a transaction.
type queue struct {
	items, pending, done *bolt.Bucket
}

// enqueue stores e as pending unless its key is already there, in which
// case it loads the stored entry into e. It reports whether e was new.
func enqueue[E queued](q queue, e *E) (bool, error) {
	key, connector, seq, state, _ := entryFields(e)
	if v := q.items.Get(key); v != nil {
		return false, json.Unmarshal(v, e)
	}
	n, err := q.pending.NextSequence()
	if err != nil {
		return false, err
	}
	*seq, *state = n, statePending
	v, err := json.Marshal(e)
	if err != nil {
		return false, err
	}
	if err := q.items.Put(key, v); err != nil {
		return false, err
	}
	return true, q.pending.Put(pendingKey(connector, n), key)
}

// update applies change to the entry stored under key. An entry that stops
// being pending moves from the pending index to the done index at now; it
// reports whether that happened.
func update[E queued](q queue, key string, now time.Time, change func(*E)) (left bool, err error) {
	v := q.items.Get([]byte(key))
	if v == nil {
		return false, fmt.Errorf("%q is not stored", key)
	}
	var e E
	if err := json.Unmarshal(v, &e); err != nil {
		return false, err
	}
	_, connector, _, before, _ := entryFields(&e)
	wasPending := *before == statePending
	change(&e)
	_, _, seq, state, doneAt := entryFields(&e)
	if wasPending && *state != statePending {
		left = true
		*doneAt = now.UTC()
		if err := q.pending.Delete(pendingKey(connector, *seq)); err != nil {
			return false, err
		}
		if err := q.done.Put(doneKey(now, *seq), []byte(key)); err != nil {
			return false, err
		}
	}
	nv, err := json.Marshal(&e)
	if err != nil {
		return false, err
	}
	return left, q.items.Put([]byte(key), nv)
}

// listPending returns a connector's pending entries, oldest first. It reads
// only that connector's range of the index.
func listPending[E queued](q queue, connector string) ([]E, error) {
	var out []E
	prefix := pendingPrefix(connector)
	c := q.pending.Cursor()
	for k, key := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, key = c.Next() {
		v := q.items.Get(key)
		if v == nil {
			return nil, fmt.Errorf("pending index names missing entry %q", key)
		}
		var e E
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("entry %q: %w", key, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// pendingConnectors returns the connectors that have pending entries,
// skipping over each one's range instead of walking it.
func pendingConnectors(q queue) []string {
	var out []string
	c := q.pending.Cursor()
	for k, _ := c.First(); k != nil; {
		i := bytes.IndexByte(k, 0)
		if i < 0 {
			k, _ = c.Next() // not written by this version; ignored
			continue
		}
		connector := string(k[:i])
		out = append(out, connector)
		k, _ = c.Seek(append([]byte(connector), 1))
	}
	return out
}

func inboxQueue(tx *bolt.Tx) queue {
	items, pending, done := inboxBuckets(tx)
	return queue{items, pending, done}
}

func outboxQueue(tx *bolt.Tx) queue {
	items, pending, done := outboxBuckets(tx)
	return queue{items, pending, done}
}

// accept stores m as pending unless its key is already in the inbox, and
// returns the stored entry and whether it was new. It returns after the
// commit is on disk.
func (s *store) accept(m inboxEntry) (inboxEntry, bool, error) {
	var created bool
	var stored inboxEntry
	err := s.write(func(tx *bolt.Tx) error {
		var err error
		stored = m
		created, err = enqueue(inboxQueue(tx), &stored)
		if created {
			tx.OnCommit(func() { s.inboxPending.Add(1) })
		}
		return err
	})
	if err != nil {
		return inboxEntry{}, false, fmt.Errorf("cannot store message in inbox: %w", err)
	}
	return stored, created, nil
}

// pendingMessages returns the messages not yet submitted, oldest first per
// connector.
func (s *store) pendingMessages() (out []inboxEntry, err error) {
	connectors, err := s.connectorsWithPending(inboxQueue)
	if err != nil {
		return nil, err
	}
	for _, c := range connectors {
		msgs, err := s.pendingMessagesOf(c)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}

// connectorsWithPending returns the connectors with pending entries in the
// inbox or the outbox (side).
func (s *store) connectorsWithPending(side func(*bolt.Tx) queue) (out []string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out = pendingConnectors(side(tx))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read pending index: %w", err)
	}
	return out, nil
}

// pendingMessagesOf returns the pending messages of one connector, oldest
// first.
func (s *store) pendingMessagesOf(connector string) (out []inboxEntry, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out, err = listPending[inboxEntry](inboxQueue(tx), connector)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read pending inbox: %w", err)
	}
	return out, nil
}

// dueMessages returns up to limit pending messages of connector, oldest
// first, starting after the pending index key after (nil: at the start of
// its range). Entries for which waiting reports true are skipped without
// being read. It returns the index key to continue after and whether the
// range ended.
func (s *store) dueMessages(connector string, after []byte, limit int, waiting func(key string) bool) (out []inboxEntry, last []byte, end bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out, last, end = nil, after, false
		q := inboxQueue(tx)
		prefix := pendingPrefix(connector)
		c := q.pending.Cursor()
		k, key := c.Seek(prefix)
		if after != nil {
			k, key = c.Seek(after)
			if bytes.Equal(k, after) {
				k, key = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, key = c.Next() {
			if len(out) == limit {
				return nil
			}
			last = bytes.Clone(k)
			if waiting(string(key)) {
				continue
			}
			v := q.items.Get(key)
			if v == nil {
				return fmt.Errorf("pending index names missing entry %q", key)
			}
			var m inboxEntry
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("entry %q: %w", key, err)
			}
			out = append(out, m)
		}
		end = true
		return nil
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("cannot read pending inbox: %w", err)
	}
	return out, last, end, nil
}

func (s *store) updateMessage(key string, now time.Time, change func(*inboxEntry)) error {
	return s.write(func(tx *bolt.Tx) error {
		left, err := update(inboxQueue(tx), key, now, change)
		if left {
			tx.OnCommit(func() { s.inboxPending.Add(-1) })
		}
		return err
	})
}

// markSubmitted records the scheduler's run id for a message that took
// attempts Submits (failed ones are counted in memory, not written).
func (s *store) markSubmitted(key, runID string, attempts int, now time.Time) error {
	err := s.updateMessage(key, now, func(m *inboxEntry) {
		m.State, m.RunID, m.LastError = stateSubmitted, runID, ""
		m.Attempts = max(m.Attempts+1, attempts)
	})
	if err != nil {
		return fmt.Errorf("cannot mark message submitted: %w", err)
	}
	return nil
}

// refuseMessage ends a message the scheduler will never take (unknown agent,
// bad input) and, in the same transaction, queues an error reply for its
// sender, so the user hears why instead of waiting forever.
func (s *store) refuseMessage(key string, cause error, reply outboxEntry, attempts int, now time.Time) error {
	return s.answerMessage(key, stateRefused, cause, reply, attempts, now)
}

// answerMessage ends a message that runs nothing in state (refused, or
// decided) with why, and queues its reply in the same transaction.
func (s *store) answerMessage(key, state string, cause error, reply outboxEntry, attempts int, now time.Time) error {
	err := s.write(func(tx *bolt.Tx) error {
		left, err := update(inboxQueue(tx), key, now, func(m *inboxEntry) {
			m.State, m.LastError = state, cause.Error()
			m.Attempts = max(m.Attempts+1, attempts)
		})
		if err != nil {
			return err
		}
		r := reply
		created, err := enqueue(outboxQueue(tx), &r)
		tx.OnCommit(func() {
			if left {
				s.inboxPending.Add(-1)
			}
			if created {
				s.outboxPending.Add(1)
			}
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("cannot record a message answered without a run: %w", err)
	}
	return nil
}

// reply reads the outbox entry of runID.
func (s *store) reply(runID string) (outboxEntry, bool, error) {
	var r outboxEntry
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		replies, _, _ := outboxBuckets(tx)
		v := replies.Get([]byte(runID))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &r)
	})
	if err != nil {
		return outboxEntry{}, false, fmt.Errorf("cannot read outbox: %w", err)
	}
	return r, found, nil
}

// addReply stores r as pending unless its run id is already in the outbox;
// it reports whether r was new and returns after the commit is on disk.
func (s *store) addReply(r outboxEntry) (bool, error) {
	var created bool
	err := s.write(func(tx *bolt.Tx) error {
		var err error
		e := r
		created, err = enqueue(outboxQueue(tx), &e)
		if created {
			tx.OnCommit(func() { s.outboxPending.Add(1) })
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("cannot store reply in outbox: %w", err)
	}
	return created, nil
}

// pendingReplies returns the replies not yet delivered, oldest first per
// connector.
func (s *store) pendingReplies() (out []outboxEntry, err error) {
	connectors, err := s.connectorsWithPending(outboxQueue)
	if err != nil {
		return nil, err
	}
	for _, c := range connectors {
		replies, err := s.pendingRepliesOf(c)
		if err != nil {
			return nil, err
		}
		out = append(out, replies...)
	}
	return out, nil
}

// pendingRepliesOf returns the pending replies of one connector, oldest
// first.
func (s *store) pendingRepliesOf(connector string) (out []outboxEntry, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out, err = listPending[outboxEntry](outboxQueue(tx), connector)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read pending outbox: %w", err)
	}
	return out, nil
}

func (s *store) updateReply(runID string, now time.Time, change func(*outboxEntry)) error {
	return s.write(func(tx *bolt.Tx) error {
		left, err := update(outboxQueue(tx), runID, now, change)
		if left {
			tx.OnCommit(func() { s.outboxPending.Add(-1) })
		}
		return err
	})
}

func (s *store) markDelivered(runID string, at time.Time) error {
	err := s.updateReply(runID, at, func(r *outboxEntry) {
		r.State, r.DeliveredAt, r.NextAttempt, r.LastError = stateDelivered, at.UTC(), time.Time{}, ""
		r.Attempts++
	})
	if err != nil {
		return fmt.Errorf("cannot mark reply delivered: %w", err)
	}
	return nil
}

// markFailed ends a reply the platform refused for good, with its reason.
func (s *store) markFailed(runID string, reason string, at time.Time) error {
	err := s.updateReply(runID, at, func(r *outboxEntry) {
		r.State, r.NextAttempt, r.LastError = stateFailed, time.Time{}, reason
		r.Attempts++
	})
	if err != nil {
		return fmt.Errorf("cannot mark reply failed: %w", err)
	}
	return nil
}

// markAttempted records, before a reply's first attempt, that it began.
func (s *store) markAttempted(runID string, at time.Time) error {
	err := s.updateReply(runID, at, func(r *outboxEntry) { r.AttemptedAt = at.UTC() })
	if err != nil {
		return fmt.Errorf("cannot record the delivery attempt: %w", err)
	}
	return nil
}

func (s *store) recordDeliveryFailure(runID string, cause error, now, next time.Time) error {
	err := s.updateReply(runID, now, func(r *outboxEntry) {
		r.Attempts++
		r.LastError = cause.Error()
		r.NextAttempt = next
	})
	if err != nil {
		return fmt.Errorf("cannot record delivery failure: %w", err)
	}
	return nil
}

// pendingCounts returns how many messages wait for the scheduler and how many
// replies wait for their platform. It reads counters, not the indexes.
func (s *store) pendingCounts() (inbox, outbox uint32) {
	return uint32(max(s.inboxPending.Load(), 0)), uint32(max(s.outboxPending.Load(), 0))
}

// pruneBatch is how many finished entries one retention transaction
// deletes at most, so that a large backlog never holds the writer long.
const pruneBatch = 256

// pruneFinished deletes up to pruneBatch inbox and outbox entries that
// finished before cutoff, oldest first, in one transaction. It reports how
// many it deleted and whether older ones remain.
func (s *store) pruneFinished(cutoff time.Time) (deleted int, more bool, err error) {
	// Most hours nothing is due: look before taking a commit (an fsync).
	var due bool
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, q := range []queue{inboxQueue(tx), outboxQueue(tx)} {
			if k, _ := q.done.Cursor().First(); k != nil && doneKeyTime(k).Before(cutoff) {
				due = true
			}
		}
		return nil
	})
	if err != nil || !due {
		return 0, false, err
	}
	err = s.write(func(tx *bolt.Tx) error {
		deleted, more = 0, false
		for _, q := range []queue{inboxQueue(tx), outboxQueue(tx)} {
			c := q.done.Cursor()
			for k, key := c.First(); k != nil; k, key = c.First() {
				if !doneKeyTime(k).Before(cutoff) {
					break
				}
				if deleted == pruneBatch {
					more = true
					return nil
				}
				if err := q.items.Delete(key); err != nil {
					return err
				}
				if err := c.Delete(); err != nil {
					return err
				}
				deleted++
			}
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("cannot prune finished entries: %w", err)
	}
	return deleted, more, nil
}
