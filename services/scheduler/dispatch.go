package scheduler

import (
	"context"
	"errors"
	"fmt"

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
// have a run, until max_concurrent_runs are running. It returns an error only
// when the store fails.
func (s *Service) dispatch() error {
	claimed, err := s.claim()
	if err != nil {
		return err
	}
	for _, r := range claimed {
		s.log.Info("run started", "run_id", r.ID, "agent", r.Agent, "attempt", r.Attempts)
		s.emitStateChanged(r)
	}
	if len(claimed) > 0 {
		s.publishCounts()
	}
	return nil
}

// claim marks the runs to start as running, in one transaction, and starts
// them. Only the dispatcher calls it. The runs are registered in s.active
// inside the transaction (s.mu is taken briefly there, never across the
// commit), so that a CancelRun, whose transaction is serialized with this
// one, finds a run either queued or active.
func (s *Service) claim() ([]Run, error) {
	cfg := s.cfg.Load()
	limit := maxConcurrent(cfg)
	s.mu.Lock()
	if s.stopping || len(s.active) >= limit {
		s.mu.Unlock()
		return nil, nil
	}
	s.mu.Unlock()

	var claimed []Run
	var registered []*activeRun
	var bad []*corruptRecord
	now := s.clock.Now()
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		claimed, registered, bad = claimed[:0], registered[:0], bad[:0]
		s.mu.Lock()
		stopping, running := s.stopping, len(s.active)
		busy := make(map[string]bool, len(s.active))
		for _, a := range s.active {
			busy[a.agent] = true
		}
		s.mu.Unlock()
		if stopping {
			return nil
		}
		ids, err := queuedRunIDs(tx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if running+len(claimed) >= limit {
				break
			}
			r, ok, err := getRun(tx, id)
			if c, isBad := asCorrupt(err); isBad {
				bad = append(bad, c)
				continue
			}
			if err != nil {
				return err
			}
			if !ok || r.State != StateQueued {
				// A queue entry left without its run: drop it.
				if err := unindexRun(tx, id, r.Agent); err != nil {
					return err
				}
				continue
			}
			if busy[r.Agent] {
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
		for _, c := range bad {
			if err := quarantineRecord(tx, c.bucket, c.key, c.Error(), now); err != nil {
				return err
			}
		}
		s.mu.Lock()
		for _, r := range claimed {
			ctx, cancel := context.WithCancelCause(context.Background())
			a := &activeRun{agent: r.Agent, ctx: ctx, cancel: cancel, done: make(chan struct{})}
			s.active[r.ID] = a
			registered = append(registered, a)
		}
		s.mu.Unlock()
		return nil
	})
	if err != nil {
		// Nothing was committed: forget the registrations.
		s.mu.Lock()
		for i, a := range registered {
			if s.active[claimed[i].ID] == a {
				delete(s.active, claimed[i].ID)
			}
			a.cancel(errShutdown)
			close(a.done)
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("cannot start queued runs: %w", err)
	}
	for _, c := range bad {
		s.log.Error("quarantined an undecodable queued run; see berthctl status", "run_id", string(c.key), "err", c.err)
	}
	if len(bad) > 0 {
		s.publishCounts()
	}
	for i, r := range claimed {
		a := registered[i]
		s.runs.Add(1)
		go s.execute(a.ctx, a, r, cfg)
	}
	return claimed, nil
}

// execute runs r to its end and records the outcome (outside s.mu).
func (s *Service) execute(ctx context.Context, a *activeRun, r Run, cfg *config.Config) {
	defer s.runs.Done()
	res, backend, runErr := s.runOnce(ctx, r, cfg)
	cause := context.Cause(ctx)

	var final Run
	now := s.clock.Now()
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
		cur.StderrTail = cleanText(tailUTF8(res.Stderr, maxStderrTail))
		switch {
		case runErr != nil && errors.Is(cause, errShutdown):
			// Handed back by a graceful stop: not an attempt that counts.
			cur.State = StateQueued
			cur.Attempts--
		case runErr != nil && errors.Is(cause, errCanceledByUser):
			finish(&cur, StateCanceled, isolation.ReasonCanceled, "canceled while running", now)
		case runErr != nil:
			reason := isolation.ReasonOf(runErr)
			if reason == "" {
				reason = ReasonInternal
			}
			finish(&cur, StateFailed, reason, runErr.Error(), now)
		case res.Response.Error != "":
			finish(&cur, StateFailed, res.Response.Error, res.Response.Error, now)
			cur.Reply = cleanText(res.Response.Reply)
		default:
			finish(&cur, StateSucceeded, "", "", now)
			cur.Reply = cleanText(res.Response.Reply)
			// History is a convenience; it must never keep the outcome from
			// being recorded (the run would be started again).
			if err := appendHistory(tx, cur, now); err != nil {
				s.log.Error("cannot record the run in its conversation history", "run_id", cur.ID, "agent", cur.Agent, "err", err)
			}
		}
		if runErr == nil && len(res.Response.ToolCalls) > 0 {
			calls, err := boundToolCalls(res.Response.ToolCalls)
			if err != nil {
				return err
			}
			cur.ToolCalls = calls
		}
		final = cur
		return putRun(tx, cur)
	})
	s.mu.Lock()
	delete(s.active, r.ID)
	s.mu.Unlock()
	close(a.done)

	switch c, bad := asCorrupt(err); {
	case bad:
		s.setAside(c)
	case err != nil:
		// The record still says running: the next start reconciles it. The
		// store failing is the end of this process's work.
		s.log.Error("cannot record run outcome", "run_id", r.ID, "agent", r.Agent, "err", err)
		s.fail(fmt.Errorf("cannot record the outcome of run %s: %w", r.ID, err))
	default:
		s.log.Info("run ended", "run_id", r.ID, "agent", r.Agent, "backend", final.Backend, "state", final.State, "reason", final.Reason)
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
