// Package landlock is the isolation backend that runs berth-agent as a
// confined host process: an unprivileged user, a minimal environment, no
// network unless allowed, and a Landlock policy the agent applies to itself
// before it touches anything (see isolation.HostPolicy). It never runs an
// agent unconfined or as root.
package landlock

import (
	"context"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// Name is the backend's config name.
const Name = "landlock"

// Backend runs agents confined by Landlock.
type Backend struct {
	runner hostrun.Runner
}

// New returns the landlock backend.
func New() *Backend {
	return &Backend{runner: hostrun.Runner{AllowRoot: false}}
}

var _ isolation.Backend = (*Backend)(nil)

// Name returns "landlock".
func (b *Backend) Name() string { return Name }

// Run runs spec.Request as the plan's run user (never root) under the plan's
// policy, which must not be unrestricted.
func (b *Backend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	if spec.Policy.Unrestricted {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonConfinement, "the landlock backend never runs an agent unconfined (policy is unrestricted)")
	}
	return b.runner.Run(ctx, spec)
}

// Start opens a kept sandbox (isolation.Keeper) under the plan's policy,
// which must not be unrestricted.
func (b *Backend) Start(ctx context.Context, spec isolation.Spec) (isolation.Kept, error) {
	if spec.Policy.Unrestricted {
		return nil, isolation.Errorf(isolation.ReasonConfinement, "the landlock backend never runs an agent unconfined (policy is unrestricted)")
	}
	return b.runner.Start(ctx, spec)
}

var _ isolation.Keeper = (*Backend)(nil)

// Explain says which limits hold for p on this host.
func (b *Backend) Explain(p isolation.Plan) isolation.Confinement { return b.runner.Explain(p) }

// Kill ends the agent process group named by handle.
func (b *Backend) Kill(ctx context.Context, handle string) error {
	return hostrun.Kill(ctx, handle)
}
