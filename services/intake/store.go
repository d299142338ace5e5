package intake

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/boltstore"

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
)

// Entry states (the state field).
const (
	statePending   = "pending"
	stateSubmitted = "submitted"
	stateRefused   = "refused" // the scheduler refused it for good; an error reply was queued
	stateDelivered = "delivered"
)

// inboxEntry is an accepted chat message (inbox/messages).
type inboxEntry struct {
	Connector   string    `json:"connector"`
	ID          string    `json:"id"`
	Channel     string    `json:"channel"`
	ChannelName string    `json:"channel_name,omitempty"`
	Thread      string    `json:"thread,omitempty"`
	Author      string    `json:"author"`
	Text        string    `json:"text"`
	Agent       string    `json:"agent"`
	ReceivedAt  time.Time `json:"received_at"`
	State       string    `json:"state"`
	RunID       string    `json:"run_id,omitempty"`
	Attempts    int       `json:"attempts,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	Seq         uint64    `json:"seq"`
}

// Key is the message's inbox key and the scheduler's idempotency key.
func (m inboxEntry) Key() string { return messageKey(m.Connector, m.ID) }

func messageKey(connector, id string) string { return connector + "/" + id }

// outboxEntry is an agent's reply (outbox/replies), waiting to be posted to the
// connector's reply_url.
type outboxEntry struct {
	RunID       string    `json:"run_id"`
	MessageID   string    `json:"message_id"`
	Connector   string    `json:"connector"`
	Agent       string    `json:"agent,omitempty"`
	Channel     string    `json:"channel,omitempty"`
	Thread      string    `json:"thread,omitempty"`
	RunState    string    `json:"run_state,omitempty"`
	Text        string    `json:"text,omitempty"`
	Error       string    `json:"error,omitempty"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
	Seq         uint64    `json:"seq"`
}

// migrations are applied in order to databases older than their version.
// Append only; never edit a released entry.
var migrations = []boltstore.Migration{
	{Version: 1, Apply: createV1Buckets},
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

// store is intake.db. It is safe for concurrent use; bbolt serialises writers.
type store struct {
	db *bolt.DB
}

// openStore opens (creating and migrating when needed) the database at path.
// A second opener gives up after a second instead of waiting forever.
func openStore(path string) (*store, error) {
	db, err := boltstore.Open(path, "berth-intake", migrations)
	if err != nil {
		return nil, err
	}
	return &store{db: db}, nil
}

func (s *store) Close() error { return s.db.Close() }

func u64(v uint64) []byte { return boltstore.U64(v) }

func inboxBuckets(tx *bolt.Tx) (messages, pending *bolt.Bucket) {
	inbox := tx.Bucket(bucketInbox)
	return inbox.Bucket(bucketMessages), inbox.Bucket(bucketPending)
}

func outboxBuckets(tx *bolt.Tx) (replies, pending *bolt.Bucket) {
	outbox := tx.Bucket(bucketOutbox)
	return outbox.Bucket(bucketReplies), outbox.Bucket(bucketPending)
}

// message returns the inbox entry of connector/id.
func (s *store) message(connector, id string) (inboxEntry, bool, error) {
	var m inboxEntry
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		messages, _ := inboxBuckets(tx)
		v := messages.Get([]byte(messageKey(connector, id)))
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
// pending index under its sequence number while its state is pending.
type queued interface {
	inboxEntry | outboxEntry
}

// entryKey returns the bucket key of an entry, and its place in the pending
// index.
func entryKey[E queued](e *E) (key []byte, seq *uint64, state *string) {
	switch e := any(e).(type) {
	case *inboxEntry:
		return []byte(e.Key()), &e.Seq, &e.State
	case *outboxEntry:
		return []byte(e.RunID), &e.Seq, &e.State
	}
	panic("unreachable")
}

// enqueue stores e as pending unless its key is already there, in which
// case it loads the stored entry into e. It reports whether e was new.
func enqueue[E queued](items, pending *bolt.Bucket, e *E) (bool, error) {
	key, seq, state := entryKey(e)
	if v := items.Get(key); v != nil {
		return false, json.Unmarshal(v, e)
	}
	n, err := pending.NextSequence()
	if err != nil {
		return false, err
	}
	*seq, *state = n, statePending
	v, err := json.Marshal(e)
	if err != nil {
		return false, err
	}
	if err := items.Put(key, v); err != nil {
		return false, err
	}
	return true, pending.Put(u64(n), key)
}

// update applies change to the entry stored under key and drops it from the
// pending index once it is no longer pending.
func update[E queued](items, pending *bolt.Bucket, key string, change func(*E)) error {
	v := items.Get([]byte(key))
	if v == nil {
		return fmt.Errorf("%q is not stored", key)
	}
	var e E
	if err := json.Unmarshal(v, &e); err != nil {
		return err
	}
	change(&e)
	_, seq, state := entryKey(&e)
	if *state != statePending {
		if err := pending.Delete(u64(*seq)); err != nil {
			return err
		}
	}
	nv, err := json.Marshal(&e)
	if err != nil {
		return err
	}
	return items.Put([]byte(key), nv)
}

// listPending returns the pending entries, oldest first.
func listPending[E queued](items, pending *bolt.Bucket) ([]E, error) {
	var out []E
	err := pending.ForEach(func(_, key []byte) error {
		v := items.Get(key)
		if v == nil {
			return fmt.Errorf("pending index names missing entry %q", key)
		}
		var e E
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("entry %q: %w", key, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// accept stores m as pending unless its key is already in the inbox, and
// returns the stored entry and whether it was new. It returns after the
// commit is on disk.
func (s *store) accept(m inboxEntry) (inboxEntry, bool, error) {
	var created bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		messages, pending := inboxBuckets(tx)
		var err error
		created, err = enqueue(messages, pending, &m)
		return err
	})
	if err != nil {
		return inboxEntry{}, false, fmt.Errorf("cannot store message in inbox: %w", err)
	}
	return m, created, nil
}

// pendingMessages returns the messages not yet submitted, oldest first.
func (s *store) pendingMessages() (out []inboxEntry, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out, err = listPending[inboxEntry](inboxBuckets(tx))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read pending inbox: %w", err)
	}
	return out, nil
}

func (s *store) updateMessage(key string, change func(*inboxEntry)) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		messages, pending := inboxBuckets(tx)
		return update(messages, pending, key, change)
	})
}

func (s *store) markSubmitted(key, runID string) error {
	err := s.updateMessage(key, func(m *inboxEntry) {
		m.State, m.RunID, m.LastError = stateSubmitted, runID, ""
		m.Attempts++
	})
	if err != nil {
		return fmt.Errorf("cannot mark message submitted: %w", err)
	}
	return nil
}

// refuseMessage ends a message the scheduler will never take (unknown agent,
// bad input) and, in the same transaction, queues an error reply for its
// sender, so the user hears why instead of waiting forever.
func (s *store) refuseMessage(key string, cause error, reply outboxEntry) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		messages, pending := inboxBuckets(tx)
		err := update(messages, pending, key, func(m *inboxEntry) {
			m.State, m.LastError = stateRefused, cause.Error()
			m.Attempts++
		})
		if err != nil {
			return err
		}
		replies, outPending := outboxBuckets(tx)
		_, err = enqueue(replies, outPending, &reply)
		return err
	})
	if err != nil {
		return fmt.Errorf("cannot record refused message: %w", err)
	}
	return nil
}

func (s *store) recordSubmitFailure(key string, cause error) error {
	err := s.updateMessage(key, func(m *inboxEntry) {
		m.Attempts++
		m.LastError = cause.Error()
	})
	if err != nil {
		return fmt.Errorf("cannot record submit failure: %w", err)
	}
	return nil
}

// addReply stores r as pending unless its run id is already in the outbox;
// it reports whether r was new and returns after the commit is on disk.
func (s *store) addReply(r outboxEntry) (bool, error) {
	var created bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		replies, pending := outboxBuckets(tx)
		var err error
		created, err = enqueue(replies, pending, &r)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("cannot store reply in outbox: %w", err)
	}
	return created, nil
}

// pendingReplies returns the replies not yet delivered, oldest first.
func (s *store) pendingReplies() (out []outboxEntry, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out, err = listPending[outboxEntry](outboxBuckets(tx))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read pending outbox: %w", err)
	}
	return out, nil
}

func (s *store) updateReply(runID string, change func(*outboxEntry)) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		replies, pending := outboxBuckets(tx)
		return update(replies, pending, runID, change)
	})
}

func (s *store) markDelivered(runID string, at time.Time) error {
	err := s.updateReply(runID, func(r *outboxEntry) {
		r.State, r.DeliveredAt, r.NextAttempt, r.LastError = stateDelivered, at, time.Time{}, ""
		r.Attempts++
	})
	if err != nil {
		return fmt.Errorf("cannot mark reply delivered: %w", err)
	}
	return nil
}

func (s *store) recordDeliveryFailure(runID string, cause error, next func(attempts int) time.Time) error {
	err := s.updateReply(runID, func(r *outboxEntry) {
		r.Attempts++
		r.LastError = cause.Error()
		r.NextAttempt = next(r.Attempts)
	})
	if err != nil {
		return fmt.Errorf("cannot record delivery failure: %w", err)
	}
	return nil
}

// pendingCounts returns how many messages wait for the scheduler and how many
// replies wait for their platform.
func (s *store) pendingCounts() (inbox, outbox uint32, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		_, in := inboxBuckets(tx)
		_, out := outboxBuckets(tx)
		inbox, outbox = uint32(countKeys(in)), uint32(countKeys(out))
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("cannot count pending entries: %w", err)
	}
	return inbox, outbox, nil
}

func countKeys(b *bolt.Bucket) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}
