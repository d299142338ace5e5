package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// maxConcurrent is [scheduler] max_concurrent_runs, 4 when unset.
func maxConcurrent(cfg *config.Config) int {
	if n := cfg.Scheduler.MaxConcurrentRuns; n > 0 {
		return n
	}
	return 4
}

// dispatch starts queued runs in FIFO order, skipping agents that already
// have a run, until max_concurrent_runs are running.
func (s *Service) dispatch() {
	claimed := s.claim()
	for _, r := range claimed {
		s.log.Info("run started", "run", r.ID, "agent", r.Agent, "attempt", r.Attempts)
		s.emitStateChanged(r)
	}
	if len(claimed) > 0 {
		s.publishCounts()
	}
}

// claim marks the runs to start as running and starts them.
func (s *Service) claim() []Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil
	}
	cfg := s.cfg.Load()
	limit := maxConcurrent(cfg)
	if len(s.active) >= limit {
		return nil
	}
	busy := make(map[string]bool, len(s.active))
	for _, a := range s.active {
		busy[a.agent] = true
	}
	var claimed []Run
	now := time.Now()
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		claimed = claimed[:0]
		for _, id := range queuedRunIDs(tx) {
			if len(s.active)+len(claimed) >= limit {
				break
			}
			r, ok, err := getRun(tx, id)
			if err != nil {
				return err
			}
			if !ok || busy[r.Agent] {
				continue
			}
			busy[r.Agent] = true
			r.State = StateRunning
			r.Attempts++
			r.StartedAt = now
			r.Handle = ""
			if err := putRun(tx, r); err != nil {
				return err
			}
			claimed = append(claimed, r)
		}
		return nil
	})
	if err != nil {
		s.log.Error("cannot start queued runs", "err", err)
		return nil
	}
	for _, r := range claimed {
		ctx, cancel := context.WithCancelCause(context.Background())
		a := &activeRun{agent: r.Agent, cancel: cancel, done: make(chan struct{})}
		s.active[r.ID] = a
		s.runs.Add(1)
		go s.execute(ctx, a, r, cfg)
	}
	return claimed
}

// execute runs r to its end and records the outcome.
func (s *Service) execute(ctx context.Context, a *activeRun, r Run, cfg *config.Config) {
	defer s.runs.Done()
	res, backend, runErr := s.runOnce(ctx, r, cfg)
	cause := context.Cause(ctx)

	s.mu.Lock()
	var final Run
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		cur, ok, err := getRun(tx, r.ID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("run %s vanished", r.ID)
		}
		if backend != "" {
			cur.Backend = backend
		}
		cur.Handle = ""
		cur.StderrTail = trimTail(res.Stderr, maxStderrTail)
		switch {
		case runErr != nil && errors.Is(cause, errShutdown):
			// Handed back by a graceful stop: not an attempt that counts.
			cur.State = StateQueued
			cur.Attempts--
		case runErr != nil && errors.Is(cause, errCanceledByUser):
			finish(&cur, StateCanceled, isolation.ReasonCanceled, "canceled while running")
		case runErr != nil:
			reason := isolation.ReasonOf(runErr)
			if reason == "" {
				reason = ReasonInternal
			}
			finish(&cur, StateFailed, reason, runErr.Error())
		case res.Response.Error != "":
			finish(&cur, StateFailed, res.Response.Error, res.Response.Error)
			cur.Reply = res.Response.Reply
		default:
			finish(&cur, StateSucceeded, "", "")
			cur.Reply = res.Response.Reply
			// History is a convenience; it must never keep the outcome from
			// being recorded (the run would be started again).
			if err := appendHistory(tx, cur); err != nil {
				s.log.Error("cannot record the run in its conversation history", "run", cur.ID, "agent", cur.Agent, "err", err)
			}
		}
		if runErr == nil && len(res.Response.ToolCalls) > 0 {
			calls, err := json.Marshal(res.Response.ToolCalls)
			if err != nil {
				return fmt.Errorf("cannot encode tool calls: %w", err)
			}
			cur.ToolCalls = calls
		}
		final = cur
		return putRun(tx, cur)
	})
	delete(s.active, r.ID)
	close(a.done)
	s.mu.Unlock()

	if err != nil {
		// The record still says running: the next start reconciles it.
		s.log.Error("cannot record run outcome", "run", r.ID, "err", err)
	} else {
		s.log.Info("run ended", "run", r.ID, "agent", r.Agent, "state", final.State, "reason", final.Reason)
		if Finished(final.State) {
			s.emitFinished(final)
		} else {
			s.emitStateChanged(final)
		}
	}
	s.publishCounts()
	wake(s.wakeDispatch)
	wake(s.wakeDeliver)
}
