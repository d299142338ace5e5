package runprep

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// KeptInput names a conversation's sandbox to prepare (ADR 21): it is
// planned like a run whose id is the sandbox's id, so its cgroup or
// container and its egress directory are named by it.
type KeptInput struct {
	Input
	// Lifetime is how long the sandbox may live ([agents.sandbox]
	// max_lifetime): its egress CA must hold as long.
	Lifetime time.Duration
	// OnEgress is told each decision of the sandbox's egress proxy as it is
	// made: activity of the sandbox. It must not block.
	OnEgress func(isolation.EgressDecision)
}

// keepOptions are what a kept sandbox's preparation adds to a run's.
type keepOptions struct {
	lifetime time.Duration
	onEgress func(isolation.EgressDecision)
}

// PreparedKept is a conversation's sandbox ready to start: its plan, the
// backend that keeps it and its egress proxy, which lives as long as the
// sandbox. Call Finish once the sandbox is stopped (or never started).
type PreparedKept struct {
	*Prepared
	// Keeper starts the sandbox (Keeper.Start with Spec).
	Keeper isolation.Keeper
}

// PrepareKept readies a kept sandbox of in.Agent as Prepare readies a run,
// on a backend that can keep one. The error is a *isolation.RunError; as
// with Prepare, the returned value names the backend even then, and needs
// no Finish.
func (p *Preparer) PrepareKept(ctx context.Context, in KeptInput) (*PreparedKept, error) {
	prep, err := p.prepare(ctx, in.Input, &keepOptions{lifetime: in.Lifetime, onEgress: in.OnEgress})
	if prep == nil {
		return nil, err
	}
	out := &PreparedKept{Prepared: prep}
	if err != nil {
		return out, err
	}
	keeper, ok := prep.Backend.(isolation.Keeper)
	if !ok {
		prep.Finish()
		return out, isolation.Errorf(isolation.ReasonNoBackend, "backend %s cannot keep a sandbox between messages; set [agents.sandbox] scope = \"message\"", prep.Backend.Name())
	}
	out.Keeper = keeper
	return out, nil
}

// OpeningSpec is what Keeper.Start takes: the sandbox's plan and an opening
// request (its confinement only; nothing is run). onStart gets the
// sandbox's handle before the agent reads anything.
func (k *PreparedKept) OpeningSpec(agent agentproto.Agent, onStart func(handle string) error) isolation.Spec {
	plan := k.Plan
	req := agentproto.Request{
		Version:   agentproto.Version,
		RunID:     plan.RunID,
		Agent:     agent,
		Policy:    plan.Policy,
		Workspace: plan.SandboxWorkspace,
	}
	if len(plan.Providers) > 0 {
		req.Provider, req.Fallback = plan.Providers[0], plan.Providers[1:]
	}
	return k.Spec(req, onStart)
}

// CutEgress returns the egress decisions of the sandbox since the last cut
// and starts a fresh record: each run's record keeps its own.
func (k *PreparedKept) CutEgress() egress.Record {
	if k == nil || k.proxy == nil {
		return egress.Record{}
	}
	return k.proxy.Cut()
}
