package scheduler

import (
	"context"
	"time"
)

// drainTimeout bounds the drain at stop.
const drainTimeout = 30 * time.Second

// warmLoop fills the pools at start and after every reload, until ctx ends
// (runprep.Preparer.Warm).
func (s *Service) warmLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wakeWarm:
			s.prep.Warm(ctx, s.cfg.Load())
		}
	}
}

// drainPools removes the waiting sandboxes when the scheduler stops.
func (s *Service) drainPools() {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	s.prep.Drain(ctx)
}
