package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
)

// Retention defaults, used when [retention] leaves a field at zero.
const (
	defaultFinishedRuns     = 30 * 24 * time.Hour
	defaultRunsPerAgent     = 10000
	defaultIdleConversation = 30 * 24 * time.Hour
)

// Retention pacing: a pass at start and then every retentionInterval; at
// most retentionBatch deletions per transaction and scanBatch keys per read
// transaction, so Submit and the dispatcher never wait long for the store.
const (
	retentionInterval = 10 * time.Minute
	retentionBatch    = 500
	scanBatch         = 2000
)

// retention is cfg's [retention] with the defaults filled in.
func retention(cfg *config.Config) config.Retention {
	r := cfg.Retention
	if r.FinishedRuns <= 0 {
		r.FinishedRuns = defaultFinishedRuns
	}
	if r.RunsPerAgent <= 0 {
		r.RunsPerAgent = defaultRunsPerAgent
	}
	if r.IdleConversation <= 0 {
		r.IdleConversation = defaultIdleConversation
	}
	return r
}

// retainReport is what one retention pass did.
type retainReport struct {
	Runs          int // runs deleted
	Conversations int // conversations deleted
	Err           error
}

// retentionLoop prunes until ctx is done. Its errors are logged; the next
// pass tries again.
func (s *Service) retentionLoop(ctx context.Context) {
	ticker := s.clock.NewTicker(retentionInterval)
	defer ticker.Stop()
	for {
		rep := s.prune(ctx)
		if rep.Err != nil && ctx.Err() == nil {
			s.log.Error("cannot prune old runs and conversations; trying again later", "err", rep.Err)
		} else if rep.Runs > 0 || rep.Conversations > 0 {
			s.log.Info("pruned old runs and conversations", "runs", rep.Runs, "conversations", rep.Conversations)
		}
		if s.retained != nil {
			select {
			case s.retained <- rep:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}

// prune is one retention pass: finished and delivered runs past
// FinishedRuns, finished runs beyond RunsPerAgent per agent (oldest first,
// undelivered ones kept and counted), and conversations idle past
// IdleConversation. Queued, running and undelivered runs are never deleted.
func (s *Service) prune(ctx context.Context) retainReport {
	ret := retention(s.cfg.Load())
	now := s.clock.Now()
	var rep retainReport
	var err error
	if rep.Runs, err = s.pruneOldRuns(ctx, now.Add(-ret.FinishedRuns)); err != nil {
		rep.Err = fmt.Errorf("cannot prune old runs: %w", err)
		return rep
	}
	n, err := s.pruneRunsPerAgent(ctx, ret.RunsPerAgent)
	rep.Runs += n
	if err != nil {
		rep.Err = fmt.Errorf("cannot prune runs beyond %d per agent: %w", ret.RunsPerAgent, err)
		return rep
	}
	if rep.Conversations, err = s.pruneConversations(ctx, now, ret.IdleConversation); err != nil {
		rep.Err = fmt.Errorf("cannot prune idle conversations: %w", err)
	}
	// usage/ keeps usageDays of each agent's days (usage.go).
	if _, err := s.pruneUsage(ctx, now.Add(-usageDays*24*time.Hour)); err != nil && rep.Err == nil {
		rep.Err = fmt.Errorf("cannot prune old usage: %w", err)
	}
	if rep.Runs > 0 {
		s.publishCounts()
	}
	return rep
}

// walkKeys calls visit for the keys of bucket that start with prefix, in
// order, reading at most scanBatch keys per read transaction. visit returns
// false to stop.
func (s *Service) walkKeys(ctx context.Context, bucket, prefix []byte, visit func(tx *bolt.Tx, k, v []byte) bool) error {
	var after []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		done := true
		err := s.store.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucket).Cursor()
			var k, v []byte
			if after == nil {
				k, v = c.Seek(prefix)
			} else if k, v = c.Seek(after); bytes.Equal(k, after) {
				k, v = c.Next()
			}
			for n := 0; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if !visit(tx, k, v) {
					return nil
				}
				if n++; n == scanBatch {
					after, done = bytes.Clone(k), false
					return nil
				}
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// deleteRuns deletes the listed finished, delivered runs in transactions of
// at most retentionBatch, checking each again inside the transaction.
func (s *Service) deleteRuns(ctx context.Context, ids []string) (int, error) {
	deleted := 0
	for len(ids) > 0 {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		batch := ids[:min(len(ids), retentionBatch)]
		ids = ids[len(batch):]
		n := 0
		var messages []string
		err := s.store.update(func(tx *bolt.Tx) error {
			n, messages = 0, messages[:0]
			for _, id := range batch {
				sum, ok, err := getSummary(tx, []byte(id))
				if err != nil || !ok || !Finished(sum.State) || !sum.Delivered {
					continue // changed, or quarantined by a reader: not ours to delete
				}
				if err := deleteRun(tx, sum); err != nil {
					return err
				}
				messages = append(messages, sum.MessageID)
				n++
			}
			return nil
		})
		if err != nil {
			return deleted, err
		}
		s.dropStaged(messages)
		for _, id := range batch {
			// Delivered runs' files went at delivery; this catches a
			// removal that failed or a crash right after the mark.
			s.removeReplyFiles(id)
		}
		deleted += n
	}
	return deleted, nil
}

// pruneOldRuns deletes finished, delivered runs that finished before cutoff.
// Runs are indexed in creation order, and a run finishes after it is
// created, so each state's walk stops at the first run created after cutoff.
func (s *Service) pruneOldRuns(ctx context.Context, cutoff time.Time) (int, error) {
	var ids []string
	for _, state := range finishedStates {
		prefix := indexKey(state, "")
		err := s.walkKeys(ctx, bucketByState, prefix, func(tx *bolt.Tx, k, _ []byte) bool {
			sum, ok, err := getSummary(tx, k[len(prefix):])
			if err != nil || !ok {
				return true
			}
			if sum.CreatedAt.After(cutoff) {
				return false
			}
			finished := sum.FinishedAt
			if finished.IsZero() { // written without a finish time: go by creation
				finished = sum.CreatedAt
			}
			if sum.Delivered && finished.Before(cutoff) {
				ids = append(ids, sum.ID)
			}
			return true
		})
		if err != nil {
			return 0, err
		}
	}
	return s.deleteRuns(ctx, ids)
}

// pruneRunsPerAgent keeps the newest keep finished runs of each agent.
func (s *Service) pruneRunsPerAgent(ctx context.Context, keep int) (int, error) {
	agents, err := s.indexedAgents(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, agent := range agents {
		type finishedRun struct {
			id        string
			delivered bool
		}
		var finished []finishedRun // oldest first
		prefix := indexKey(agent, "")
		err := s.walkKeys(ctx, bucketByAgent, prefix, func(tx *bolt.Tx, k, _ []byte) bool {
			if sum, ok, err := getSummary(tx, k[len(prefix):]); err == nil && ok && Finished(sum.State) {
				finished = append(finished, finishedRun{sum.ID, sum.Delivered})
			}
			return true
		})
		if err != nil {
			return deleted, err
		}
		excess := len(finished) - keep
		if excess <= 0 {
			continue
		}
		var ids []string
		for _, f := range finished {
			if len(ids) == excess {
				break
			}
			if f.delivered {
				ids = append(ids, f.id)
			}
		}
		n, err := s.deleteRuns(ctx, ids)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// indexedAgents lists the agents by_agent/ has runs of, jumping from one
// agent's keys to the next.
func (s *Service) indexedAgents(ctx context.Context) ([]string, error) {
	var agents []string
	err := s.store.db.View(func(tx *bolt.Tx) error {
		c := byAgentBucket(tx).Cursor()
		for k, _ := c.First(); k != nil; {
			if err := ctx.Err(); err != nil {
				return err
			}
			i := bytes.IndexByte(k, 0)
			if i < 0 {
				k, _ = c.Next()
				continue
			}
			agents = append(agents, string(k[:i]))
			k, _ = c.Seek(append(bytes.Clone(k[:i]), 1)) // past "<agent>\x00..."
		}
		return nil
	})
	return agents, err
}

// pruneConversations deletes conversations with no turn for idle. A
// conversation written before schema version 3 has no time: its idle time
// starts now.
func (s *Service) pruneConversations(ctx context.Context, now time.Time, idle time.Duration) (int, error) {
	var expired, untimed [][]byte
	var bad []*corruptRecord
	err := s.walkKeys(ctx, bucketHistory, nil, func(_ *bolt.Tx, k, v []byte) bool {
		c, err := decodeConversation(k, v)
		switch cr, isBad := asCorrupt(err); {
		case isBad:
			bad = append(bad, cr)
		case c.UpdatedAt.IsZero():
			untimed = append(untimed, bytes.Clone(k))
		case now.Sub(c.UpdatedAt) > idle:
			expired = append(expired, bytes.Clone(k))
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	s.setAside(bad...)
	for len(untimed) > 0 {
		batch := untimed[:min(len(untimed), retentionBatch)]
		untimed = untimed[len(batch):]
		err := s.store.update(func(tx *bolt.Tx) error {
			for _, k := range batch {
				v := historyBucket(tx).Get(k)
				if v == nil {
					continue
				}
				c, err := decodeConversation(k, v)
				if err != nil || !c.UpdatedAt.IsZero() {
					continue
				}
				c.UpdatedAt = now
				if err := putConversation(tx, k, c); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	deleted := 0
	for len(expired) > 0 {
		batch := expired[:min(len(expired), retentionBatch)]
		expired = expired[len(batch):]
		err := s.store.update(func(tx *bolt.Tx) error {
			for _, k := range batch {
				v := historyBucket(tx).Get(k)
				if v == nil {
					continue
				}
				if c, err := decodeConversation(k, v); err != nil || now.Sub(c.UpdatedAt) <= idle {
					continue // a turn came in meanwhile
				}
				if err := historyBucket(tx).Delete(k); err != nil {
					return fmt.Errorf("cannot delete conversation: %w", err)
				}
				deleted++
			}
			return nil
		})
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}
