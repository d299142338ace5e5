package runprep

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/config"
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

// warmImageTimeout bounds how long filling a pool waits for its image.
const warmImageTimeout = 10 * time.Minute

// Warm hands each warming backend the agents of cfg that want a warm pool,
// with the plan a run of theirs would get (without a run id or keys: no
// request ever goes into a pool), on the agent's own uid and workspace and
// with the image berth-imaged gives it, so a run finds its pool. Nothing is
// handed over once ctx is done (the pools are drained next).
func (p *Preparer) Warm(ctx context.Context, cfg *config.Config) {
	specs := map[Warmer][]isolation.Spec{}
	for _, b := range p.opts.Backends {
		if w, ok := b.(Warmer); ok {
			specs[w] = nil
		}
	}
	if len(specs) == 0 {
		return
	}
	for _, id := range cfg.AgentIDs() {
		a, err := cfg.Agent(id)
		if err != nil {
			continue
		}
		// The backend without a plan: an agent that warms nothing gets no
		// uid and no workspace here.
		kind := runplan.BackendOf(a, p.opts.ForceUnrestricted)
		w, ok := p.opts.Backends[string(kind)].(Warmer)
		warm := kind == isolation.BackendContainer && a.Container.Warm > 0 ||
			kind == isolation.BackendKubernetes && cfg.Kubernetes.WarmPods() > 0
		if !ok || !warm {
			continue
		}
		spec, err := p.warmSpec(ctx, cfg, a)
		if err != nil {
			p.log.Warn("cannot warm sandboxes", "agent", a.ID, "backend", kind, "err", err)
			continue
		}
		specs[w] = append(specs[w], spec)
	}
	if ctx.Err() != nil {
		return
	}
	for w, list := range specs {
		w.Warm(list)
	}
}

// warmSpec is the spec of a's warm pool: the agent's own uid and its
// workspace image, as a run of its gets them (a container warmed on the
// bare directory would bypass the quota), and its isolation image.
func (p *Preparer) warmSpec(ctx context.Context, cfg *config.Config, a config.Agent) (isolation.Spec, error) {
	host := p.Facts(cfg, a.ID)
	if host.RunUserErr != nil {
		return isolation.Spec{}, host.RunUserErr
	}
	if err := p.readyWorkspace(ctx, cfg, a, host.RunUser); err != nil {
		return isolation.Spec{}, err
	}
	e, err := runplan.Explain(cfg, a.ID, host)
	if err != nil {
		return isolation.Spec{}, err
	}
	plan := e.Plan
	imageCtx, cancel := context.WithTimeout(ctx, warmImageTimeout)
	defer cancel()
	if err := p.isolationImage(imageCtx, &plan); err != nil {
		return isolation.Spec{}, fmt.Errorf("no image yet; runs build it: %w", err)
	}
	return isolation.Spec{Plan: plan}, nil
}

// Drain removes every warming backend's waiting sandboxes (the scheduler
// stops); what cannot be removed now the next start's sweep removes.
func (p *Preparer) Drain(ctx context.Context) {
	drained := map[isolation.Backend]bool{}
	for name, b := range p.opts.Backends {
		w, ok := b.(Warmer)
		if !ok || drained[b] {
			continue
		}
		drained[b] = true
		if err := w.Drain(ctx); err != nil {
			p.log.Warn("cannot drain warm sandboxes; the next start removes them", "backend", name, "err", err)
		}
	}
}
