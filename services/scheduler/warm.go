package scheduler

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// Warmer is a backend that keeps sandboxes started ahead of messages: the
// container backend's warm pool (container_mode.warm).
type Warmer interface {
	// Warm sets the pools: one per spec whose plan has Container.Warm above
	// zero; the specs carry no request. Agents left out are drained.
	Warm(specs []isolation.Spec)
	// Drain removes every waiting sandbox.
	Drain(ctx context.Context) error
}

// drainTimeout bounds the drain at stop.
const drainTimeout = 30 * time.Second

// warmImageTimeout bounds how long filling a pool waits for its image.
const warmImageTimeout = 10 * time.Minute

// warmLoop fills the pools at start and after every reload, until ctx ends.
func (s *Service) warmLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wakeWarm:
			s.warmPools(ctx)
		}
	}
}

// warmPools hands each warming backend the agents that want a warm pool,
// with the plan a run of theirs would get (without a run id or keys: no
// request ever goes into a pool), including the image berth-imaged gives
// it, so a run finds its pool.
func (s *Service) warmPools(ctx context.Context) {
	cfg := s.cfg.Load()
	specs := map[Warmer][]isolation.Spec{}
	for _, b := range s.opts.Backends {
		if w, ok := b.(Warmer); ok {
			specs[w] = nil
		}
	}
	if len(specs) == 0 {
		return
	}
	host := s.hostFacts(cfg)
	if host.RunUserErr != nil {
		s.log.Warn("cannot warm containers", "err", host.RunUserErr)
		return
	}
	for _, id := range cfg.AgentIDs() {
		a, err := cfg.Agent(id)
		if err != nil || a.Container.Warm == 0 {
			continue
		}
		// The plan names the backend; the shared facts suffice to tell it,
		// and allocate no uid for an agent that warms nothing.
		if e, err := runplan.Explain(cfg, a.ID, host); err != nil || e.Plan.Backend != isolation.BackendContainer {
			if err != nil {
				s.log.Warn("cannot warm containers", "agent", a.ID, "err", err)
			}
			continue
		}
		kind := isolation.BackendContainer
		w, ok := s.opts.Backends[string(kind)].(Warmer)
		if !ok {
			continue
		}
		// The agent's own uid and its workspace image, as a run of its
		// gets them: a container warmed on the bare directory would
		// bypass the quota.
		host := s.agentFacts(cfg, a.ID)
		if host.RunUserErr != nil {
			s.log.Warn("cannot warm containers", "agent", a.ID, "backend", kind, "err", host.RunUserErr)
			continue
		}
		if err := s.readyWorkspace(ctx, a, host.RunUser); err != nil {
			s.log.Warn("cannot warm containers", "agent", a.ID, "backend", kind, "err", err)
			continue
		}
		e, err := runplan.Explain(cfg, a.ID, host)
		if err != nil {
			s.log.Warn("cannot warm containers", "agent", a.ID, "backend", kind, "err", err)
			continue
		}
		plan := e.Plan
		imageCtx, cancel := context.WithTimeout(ctx, warmImageTimeout)
		err = s.isolationImage(imageCtx, &plan)
		cancel()
		if err != nil {
			s.log.Warn("cannot warm containers: no image yet; runs build it", "agent", a.ID, "backend", kind, "err", err)
			continue
		}
		specs[w] = append(specs[w], isolation.Spec{Plan: plan})
	}
	if ctx.Err() != nil {
		return // stopping: the pools are drained next
	}
	for w, list := range specs {
		w.Warm(list)
	}
}

// drainPools removes the waiting sandboxes when the scheduler stops.
func (s *Service) drainPools() {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	drained := map[isolation.Backend]bool{}
	for name, b := range s.opts.Backends {
		w, ok := b.(Warmer)
		if !ok || drained[b] {
			continue
		}
		drained[b] = true
		if err := w.Drain(ctx); err != nil {
			s.log.Warn("cannot drain warm sandboxes; the next start removes them", "backend", name, "err", err)
		}
	}
}
