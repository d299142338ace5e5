package scheduler

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// Warmer is a backend that keeps sandboxes started ahead of messages: the
// container backend's warm pool (container_mode.warm).
type Warmer interface {
	// Warm sets the pools: one per spec with Container.Warm above zero; the
	// specs carry no request. Agents left out are drained.
	Warm(specs []isolation.Spec)
	// Drain removes every waiting sandbox.
	Drain(ctx context.Context) error
}

// drainTimeout bounds the drain at stop.
const drainTimeout = 30 * time.Second

// warmPools hands each warming backend the agents that want a warm pool,
// with the same workspace, user and settings a run of theirs would get.
func (s *Service) warmPools() {
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
	runUser, err := s.runUser(cfg)
	if err != nil {
		s.log.Warn("cannot warm containers", "err", err)
		return
	}
	for _, id := range cfg.AgentIDs() {
		a, err := cfg.Agent(id)
		if err != nil || a.Isolation != "container" || a.Container.Warm == 0 {
			continue
		}
		w, ok := s.opts.Backends[a.Isolation].(Warmer)
		if !ok {
			continue
		}
		ws, err := s.prepareWorkspace(a, runUser)
		if err != nil {
			s.log.Warn("cannot warm containers", "agent", a.ID, "err", err)
			continue
		}
		specs[w] = append(specs[w], warmSpec(cfg, a, ws))
	}
	for w, list := range specs {
		w.Warm(list)
	}
}

func warmSpec(cfg *config.Config, a config.Agent, workspace string) isolation.Spec {
	return isolation.Spec{
		AgentID:     a.ID,
		Workspace:   workspace,
		AgentBinary: cfg.Scheduler.AgentBinary,
		RunAs:       cfg.Scheduler.RunAs,
		Timeout:     a.Timeout,
		Container:   a.Container,
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
