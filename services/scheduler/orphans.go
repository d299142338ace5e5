package scheduler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// sweepInterval is how often the sweep runs again after the one at start:
// it finds what that one could not remove (an engine that was down) or
// could not see yet (a create the engine finished after the crash).
const sweepInterval = 2 * time.Minute

// sweepLoop sweeps once after reconcile and then every sweepInterval until
// ctx is done. Dispatch does not wait for it: a sweep never takes what this
// process runs, because a run is active with its attempt (isLiveAttempt)
// before its sandbox exists, and anything of a run that is not its live
// attempt is an orphan: a run queued again after a crash keeps its id, and
// the dead attempt's sandbox must not be kept for the live one's sake.
func (s *Service) sweepLoop(ctx context.Context) {
	ticker := s.clock.NewTicker(sweepInterval)
	defer ticker.Stop()
	for {
		s.sweepOrphans(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}

// sweepOrphans is one pass of the run preparation's sweep
// (runprep.Preparer.Sweep) over what is not of a live attempt.
func (s *Service) sweepOrphans(ctx context.Context) {
	s.prep.Sweep(ctx, s.isLiveAttempt)
}

// isLiveAttempt reports whether this process runs attempt of runID.
func (s *Service) isLiveAttempt(runID string, attempt int) bool {
	if s.sandboxes.live(runID, attempt) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.active[runID]
	return ok && a.attempt == attempt
}

// Points of a start where Options.Hold is called.
const (
	// HoldBeforeHandle: the sandbox exists, its handle is not committed.
	HoldBeforeHandle = "before-handle"
	// HoldBeforeAnswer: the handle is committed, the answer is not in.
	HoldBeforeAnswer = "before-answer"
)

// hold calls Options.Hold, if any, at point of r's start.
func (s *Service) hold(ctx context.Context, point string, r Run) {
	if s.opts.Hold != nil {
		s.opts.Hold(ctx, point, r.ID, r.Attempt)
	}
}

// HoldAtFiles is an Options.Hold for crash tests, nil when dir is "": a
// start reaching a point for which the test made the file dir/<point>
// removes that file (so the restarted scheduler goes past it), writes
// dir/<point>.reached ("<run id> <attempt>") and blocks until its run ends,
// while the test kills the scheduler. berth-scheduler sets it from
// BERTH_TEST_HOLD_DIR, which nothing but a test sets.
func HoldAtFiles(dir string) func(ctx context.Context, point, runID string, attempt int) {
	if dir == "" {
		return nil
	}
	return func(ctx context.Context, point, runID string, attempt int) {
		// On another thread: a host run calls OnStart on the thread it
		// started the agent from, which is in the run's mount namespace
		// (its own /tmp).
		held := make(chan bool)
		go func() {
			if os.Remove(filepath.Join(dir, point)) != nil {
				held <- false // not asked for, or taken by another run
				return
			}
			reached := fmt.Appendf(nil, "%s %d\n", runID, attempt)
			held <- os.WriteFile(filepath.Join(dir, point+".reached"), reached, 0o644) == nil
		}()
		if <-held {
			<-ctx.Done()
		}
	}
}
