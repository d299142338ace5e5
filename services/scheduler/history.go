package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Conversation history bounds: what one (connector, channel, thread) keeps
// and passes to the agent as Request.History. The oldest turns go first.
const (
	HistoryMaxTurns = 20
	HistoryMaxBytes = 32 << 10
)

// migrateHistory (schema version 2) adds history/.
func migrateHistory(tx *bolt.Tx) error {
	if _, err := tx.CreateBucketIfNotExists(bucketHistory); err != nil {
		return fmt.Errorf("cannot create bucket %s: %w", bucketHistory, err)
	}
	return nil
}

// historyKey names a conversation of one agent: agent, connector, channel and
// thread joined by NUL (which none of them can contain). The agent is part of
// it so a channel re-bound to another agent does not hand over its past.
func historyKey(r Run) []byte {
	return []byte(r.Agent + "\x00" + r.Connector + "\x00" + r.Channel + "\x00" + r.Thread)
}

// conversation is a history/ value. Before schema version 3 the value was
// the bare turns array; such a value reads with a zero UpdatedAt.
type conversation struct {
	UpdatedAt time.Time         `json:"updated_at"`
	Turns     []agentproto.Turn `json:"turns"`
}

// decodeConversation reads a history/ value of either format.
func decodeConversation(key, v []byte) (conversation, error) {
	var c conversation
	var err error
	if t := bytes.TrimLeft(v, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		err = json.Unmarshal(v, &c.Turns)
	} else {
		err = json.Unmarshal(v, &c)
	}
	if err != nil {
		return conversation{}, &corruptRecord{bucket: bucketHistory, key: bytes.Clone(key), err: err}
	}
	return c, nil
}

// loadHistory returns the earlier turns of r's conversation, oldest first.
// An undecodable conversation is a *corruptRecord error.
func loadHistory(tx *bolt.Tx, r Run) ([]agentproto.Turn, error) {
	key := historyKey(r)
	v := historyBucket(tx).Get(key)
	if v == nil {
		return nil, nil
	}
	c, err := decodeConversation(key, v)
	return c.Turns, err
}

// appendHistory adds a succeeded run's message and reply to its
// conversation and trims the oldest turns to the bounds. Runs without a
// channel (none come from a chat) keep no history. A conversation that
// cannot be decoded is quarantined and started afresh.
func appendHistory(tx *bolt.Tx, r Run, now time.Time) error {
	if r.Channel == "" || r.Reply == "" {
		return nil
	}
	turns, err := loadHistory(tx, r)
	if c, bad := asCorrupt(err); bad {
		if err := quarantineRecord(tx, c.bucket, c.key, c.Error(), now); err != nil {
			return err
		}
		turns, err = nil, nil
	}
	if err != nil {
		return err
	}
	turns = boundHistory(append(turns,
		agentproto.Turn{Role: "user", Text: r.Text},
		agentproto.Turn{Role: "assistant", Text: r.Reply}))
	if err := putConversation(tx, historyKey(r), conversation{UpdatedAt: now, Turns: turns}); err != nil {
		return fmt.Errorf("cannot store history of run %s: %w", r.ID, err)
	}
	return nil
}

// putConversation writes one history/ value.
func putConversation(tx *bolt.Tx, key []byte, c conversation) error {
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("cannot encode conversation: %w", err)
	}
	if err := historyBucket(tx).Put(key, data); err != nil {
		return fmt.Errorf("cannot store conversation: %w", err)
	}
	return nil
}

// boundHistory drops the oldest turns beyond HistoryMaxTurns or
// HistoryMaxBytes of text, then leading assistant turns so the
// conversation starts with the user.
func boundHistory(turns []agentproto.Turn) []agentproto.Turn {
	size := 0
	start := len(turns)
	for start > 0 && len(turns)-start < HistoryMaxTurns {
		n := len(turns[start-1].Text)
		if size+n > HistoryMaxBytes {
			break
		}
		size += n
		start--
	}
	for start < len(turns) && turns[start].Role != "user" {
		start++
	}
	return append([]agentproto.Turn(nil), turns[start:]...)
}

// history reads r's conversation for its request; a store error only
// costs the agent its memory of the thread, and an undecodable
// conversation is quarantined.
func (s *Service) history(r Run) []agentproto.Turn {
	var turns []agentproto.Turn
	err := s.store.db.View(func(tx *bolt.Tx) error {
		var err error
		turns, err = loadHistory(tx, r)
		return err
	})
	if c, bad := asCorrupt(err); bad {
		s.setAside(c)
	} else if err != nil {
		s.log.Error("cannot read conversation history", "run_id", r.ID, "agent", r.Agent, "err", err)
	}
	return turns
}
