package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// Sweeper is a backend that finds its sandboxes by itself (containers carry
// their run id in a label), so it can remove what a crashed scheduler left
// behind even when no handle was recorded for it.
type Sweeper interface {
	// Sweep removes the sandboxes whose run keep does not claim and returns
	// their run ids.
	Sweep(ctx context.Context, keep func(runID string) bool) ([]string, error)
}

// sweepTimeout bounds the sweep at start.
const sweepTimeout = 30 * time.Second

// sweepOrphans runs once after reconcile. Each sweeper works in the
// background, bounded by sweepTimeout, so an engine that does not answer
// holds up nothing: dispatch starts at once. That is safe because a run is
// active (isActive) before its sandbox exists, so a sweep never takes a
// sandbox of this process.
func (s *Service) sweepOrphans(ctx context.Context) {
	s.sweepEgressDirs()
	swept := map[isolation.Backend]bool{}
	for name, b := range s.opts.Backends {
		sw, ok := b.(Sweeper)
		if !ok || swept[b] {
			continue
		}
		swept[b] = true
		go s.sweep(ctx, name, sw)
	}
}

func (s *Service) sweep(ctx context.Context, name string, sw Sweeper) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	removed, err := sw.Sweep(ctx, s.isActive)
	for _, run := range removed {
		s.log.Warn("removed a sandbox left behind by an earlier scheduler", "backend", name, "run_id", run)
	}
	if err != nil {
		// Some were not removed: they keep running (and using the agent's
		// workspace) until a later start removes them.
		s.log.Error("cannot remove every sandbox left behind by an earlier scheduler; they may still be running", "backend", name, "removed", len(removed), "err", err)
	}
}

// sweepEgressDirs removes the egress socket directories of runs this
// process does not run: a crashed scheduler's proxies ended with it (their
// stdin closed), their directories did not.
func (s *Service) sweepEgressDirs() {
	root := filepath.Join(s.stateDir, "egress")
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || s.isActive(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			s.log.Warn("cannot remove an egress directory left behind", "run_id", e.Name(), "err", err)
		}
	}
}

// isActive reports whether this process runs runID.
func (s *Service) isActive(runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.active[runID]
	return ok
}
