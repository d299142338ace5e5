package scheduler

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Conversation history bounds: what one (connector, channel, thread) keeps
// and passes to the agent as Request.History. The oldest turns go first.
const (
	HistoryMaxTurns = 20
	HistoryMaxBytes = 32 << 10
)

var bucketHistory = []byte("history")

func historyBucket(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket(bucketHistory) }

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

// loadHistory returns the earlier turns of r's conversation, oldest first.
func loadHistory(tx *bolt.Tx, r Run) ([]agentproto.Turn, error) {
	v := historyBucket(tx).Get(historyKey(r))
	if v == nil {
		return nil, nil
	}
	var turns []agentproto.Turn
	if err := json.Unmarshal(v, &turns); err != nil {
		return nil, fmt.Errorf("cannot decode history of run %s: %w", r.ID, err)
	}
	return turns, nil
}

// appendHistory adds a succeeded run's message and reply to its
// conversation and trims the oldest turns to the bounds. Runs without a
// channel (none come from a chat) keep no history.
func appendHistory(tx *bolt.Tx, r Run) error {
	if r.Channel == "" || r.Reply == "" {
		return nil
	}
	turns, err := loadHistory(tx, r)
	if err != nil {
		return err
	}
	turns = boundHistory(append(turns,
		agentproto.Turn{Role: "user", Text: r.Text},
		agentproto.Turn{Role: "assistant", Text: r.Reply}))
	data, err := json.Marshal(turns)
	if err != nil {
		return fmt.Errorf("cannot encode history: %w", err)
	}
	if err := historyBucket(tx).Put(historyKey(r), data); err != nil {
		return fmt.Errorf("cannot store history of run %s: %w", r.ID, err)
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
// costs the agent its memory of the thread.
func (s *Service) history(r Run) []agentproto.Turn {
	var turns []agentproto.Turn
	err := s.store.db.View(func(tx *bolt.Tx) error {
		var err error
		turns, err = loadHistory(tx, r)
		return err
	})
	if err != nil {
		s.log.Error("cannot read conversation history", "run", r.ID, "err", err)
	}
	return turns
}
