package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/busapi"
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
	if boltstore.IsDiskFull(err) {
		// Nothing was claimed and the queue is as it was; the committer has
		// logged the full disk. The next pass (a wake, or progressInterval)
		// tries again, so the queue moves once there is room.
		return nil
	}
	if err != nil {
		return err
	}
	for _, r := range claimed {
		s.log.Info("run started", "run_id", r.ID, "agent", r.Agent, "attempt", r.Attempt)
		s.emitStateChanged(r)
	}
	if len(claimed) > 0 {
		s.publishCounts()
	}
	return nil
}

// claim marks the runs to start as running, in one write, and starts them.
// Only the dispatcher calls it. The runs are registered in s.active inside
// the transaction (s.mu is taken briefly there, never across the commit), so
// that a CancelRun, whose transaction is serialized with this one, finds a
// run either queued or active. The write shares its commit with the Submits
// and outcomes that arrive meanwhile (store.write).
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
	var update viewUpdate
	var plan *sandboxPlan
	err := s.store.write(func(tx *bolt.Tx) error {
		// A second call (the group is applied again) starts over, keeping
		// the registrations of runs it claims again: a CancelRun may hold
		// one already.
		earlier := make(map[string]*activeRun, len(registered))
		for i, a := range registered {
			earlier[claimed[i].ID] = a
		}
		claimed, registered, bad, update = claimed[:0], registered[:0], bad[:0], viewUpdate{}
		now := s.clock.Now()
		s.mu.Lock()
		for id, a := range earlier {
			if s.active[id] == a {
				delete(s.active, id)
			}
		}
		stopping, running := s.stopping, len(s.active)
		busy := make(map[string]bool, len(s.active))
		for _, a := range s.active {
			if !a.parallel {
				busy[a.agent] = true
			}
		}
		s.mu.Unlock()
		plan = s.sandboxes.plan(cfg, now)
		if !stopping && running < limit {
			var err error
			claimed, bad, update, err = s.queue.claimFromView(tx, limit-running, busy, plan.admit, now)
			if err != nil {
				return err
			}
		}
		for _, c := range bad {
			if err := quarantineRecord(tx, c.bucket, c.key, c.Error(), now); err != nil {
				return err
			}
		}
		s.mu.Lock()
		for _, r := range claimed {
			a := earlier[r.ID]
			if a == nil {
				ctx, cancel := context.WithCancelCause(context.Background())
				a = &activeRun{agent: r.Agent, ctx: ctx, cancel: cancel, done: make(chan struct{})}
			}
			a.attempt = r.Attempt
			a.parallel = plan.decided[r.ID] != nil
			delete(earlier, r.ID)
			s.active[r.ID] = a
			registered = append(registered, a)
		}
		s.mu.Unlock()
		for _, a := range earlier { // claimed before, not this time
			a.cancel(errShutdown)
			close(a.done)
		}
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
		s.queue.reset()
		return nil, fmt.Errorf("cannot start queued runs: %w", err)
	}
	if update.fresh != nil {
		s.queue.apply(update)
	}
	s.sandboxes.apply(plan, claimed, s.sandboxID)
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
	var res runOutcome
	var backend string
	var runErr error
	claim := s.sandboxes.claimOf(r.ID)
	spanCtx, runSpan := startRunSpans(ctx, r)
	started := time.Now()
	runCtx, endProgress := s.relayRunProgress(spanCtx, r)
	if claim != nil {
		res, backend, runErr = s.runInSandbox(runCtx, r, cfg, claim)
	} else {
		res, backend, runErr = s.runOnce(runCtx, r, cfg)
	}
	endProgress()
	defer s.sandboxes.forgetClaim(r.ID)
	cause := context.Cause(ctx)

	var final Run
	var historyErr error
	now := s.clock.Now()
	// Shares its commit with the Submits and other outcomes of the moment.
	// A full disk does not lose the outcome: it is kept here, the run stays
	// active (its agent starts nothing else), and the write is tried again
	// until there is room (recordOutcome).
	err := s.recordOutcome(r, func(tx *bolt.Tx) error {
		historyErr = nil
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
		if claim != nil {
			if !claim.fellBack {
				cur.Sandbox = claim.sb.id
			}
			cur.SandboxNote = joinNotes(cur.SandboxNote, claim.notes())
		}
		cur.StderrTail = cleanText(tailUTF8(res.Stderr, maxStderrTail))
		cur.Egress, cur.EgressDropped = res.Egress, res.EgressDropped
		if c := res.EgressCounts; c.Allowed+c.Refused > 0 {
			cur.EgressCounts = &c
		}
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
				reason = isolation.ReasonInternal
			}
			finish(&cur, StateFailed, reason, runErr.Error(), now)
		case res.Response.Error != "":
			finish(&cur, StateFailed, res.Response.Error, res.Response.Error, now)
			cur.Reply = cleanText(res.Response.Reply)
		default:
			finish(&cur, StateSucceeded, "", "", now)
			cur.Reply = cleanText(busapi.WithNotes(res.Response.Reply, res.files.notes))
			cur.ReplyFiles = res.files.files
			// History is a convenience; it must never keep the outcome from
			// being recorded (the run would be started again).
			historyErr = appendHistory(tx, cur, now)
		}
		if runErr == nil && len(res.Response.ToolCalls) > 0 {
			calls, err := boundToolCalls(res.Response.ToolCalls)
			if err != nil {
				return err
			}
			cur.ToolCalls = calls
		}
		if runErr == nil {
			cur.MCP = recordedMCP(res.Response.MCP)
		}
		recordUsage(&cur, res.Usage)
		final = cur
		return putRun(tx, cur)
	})
	endRunSpan(spanCtx, runSpan, started, res.Result, runErr, final.State)
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
		s.runLog(r).Error("cannot record run outcome", "err", err)
		s.fail(fmt.Errorf("cannot record the outcome of run %s: %w", r.ID, err))
	default:
		if historyErr != nil {
			s.runLog(r).Error("cannot record the run in its conversation history", "err", historyErr)
		}
		s.runLog(r).Info("run ended", "backend", final.Backend, "state", final.State, "reason", final.Reason)
		s.countEnded(final, res.Result)
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

// Waits between the attempts to record an outcome on a full disk.
const (
	outcomeRetryFirst   = 100 * time.Millisecond
	outcomeRetryLongest = 2 * time.Second
)

// recordOutcome commits fn (a finished run's record), trying again while
// the disk is full, until it commits, fails otherwise, or the scheduler
// stops. A stop gives up: the record still says running, and the next
// start's reconcile queues the run again (or fails it after two
// interruptions), which is what a crash at that moment does too.
func (s *Service) recordOutcome(r Run, fn func(*bolt.Tx) error) error {
	delay := outcomeRetryFirst
	for attempt := 1; ; attempt++ {
		err := s.store.write(fn)
		if !boltstore.IsDiskFull(err) {
			if err == nil && attempt > 1 {
				s.log.Info("run outcome recorded once the disk had room", "run_id", r.ID, "agent", r.Agent, "attempts", attempt)
			}
			return err
		}
		if attempt == 1 {
			s.log.Warn("cannot record run outcome: the state disk is full; it is kept and retried until there is room",
				"run_id", r.ID, "agent", r.Agent, "err", err)
		}
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if stopping {
			return err
		}
		<-s.clock.After(delay)
		delay = min(2*delay, outcomeRetryLongest)
	}
}
