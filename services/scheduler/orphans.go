package scheduler

import (
	"context"
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

// sweepTimeout bounds the sweep at start: an engine that does not answer
// must not hold up the landlock agents.
const sweepTimeout = 30 * time.Second

// sweepOrphans runs once after reconcile, before anything is dispatched:
// every sandbox a sweeper finds then belongs to an earlier process.
func (s *Service) sweepOrphans(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	swept := map[isolation.Backend]bool{}
	for name, b := range s.opts.Backends {
		sw, ok := b.(Sweeper)
		if !ok || swept[b] {
			continue
		}
		swept[b] = true
		removed, err := sw.Sweep(ctx, s.isActive)
		for _, run := range removed {
			s.log.Warn("removed a sandbox left behind by an earlier scheduler", "backend", name, "run", run)
		}
		if err != nil {
			s.log.Warn("cannot sweep sandboxes left behind by an earlier scheduler", "backend", name, "err", err)
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
