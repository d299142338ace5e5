// Package unrestricted is the isolation backend for agents an admin
// configured with file_access.unrestricted: berth-agent runs as a plain host
// process without Landlock (still with a minimal environment, its own process
// group and, unless allowed, no network). It may run as root. Every run is
// logged as a warning.
package unrestricted

import (
	"context"
	"log/slog"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// Name is the backend's config name.
const Name = "unrestricted"

// Backend runs agents without file confinement.
type Backend struct {
	runner hostrun.Runner
	log    *slog.Logger
}

// New returns the unrestricted backend; log nil means slog.Default().
func New(log *slog.Logger) *Backend {
	if log == nil {
		log = slog.Default()
	}
	return &Backend{runner: hostrun.Runner{AllowRoot: true}, log: log}
}

var _ isolation.Backend = (*Backend)(nil)

// Name returns "unrestricted".
func (b *Backend) Name() string { return Name }

// Run runs spec.Request without file confinement. The plan must say so
// (Policy.Unrestricted, as internal/runplan compiles it for these agents):
// a confined plan is refused rather than silently run unconfined.
func (b *Backend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	if !spec.Policy.Unrestricted {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonStart, "the unrestricted backend runs only plans without file confinement (policy.unrestricted); this one is confined")
	}
	b.log.Warn("running agent UNRESTRICTED on the host: no file confinement",
		"agent", spec.AgentID, "run_id", spec.RunID, "backend", Name, "run_as", spec.RunAs)
	return b.runner.Run(ctx, spec)
}

// Start opens a kept sandbox (isolation.Keeper) without file confinement;
// the plan must say so, as for Run.
func (b *Backend) Start(ctx context.Context, spec isolation.Spec) (isolation.Kept, error) {
	if !spec.Policy.Unrestricted {
		return nil, isolation.Errorf(isolation.ReasonStart, "the unrestricted backend runs only plans without file confinement (policy.unrestricted); this one is confined")
	}
	b.log.Warn("keeping an UNRESTRICTED agent sandbox on the host: no file confinement",
		"agent", spec.AgentID, "sandbox", spec.RunID, "backend", Name, "run_as", spec.RunAs)
	return b.runner.Start(ctx, spec)
}

var _ isolation.Keeper = (*Backend)(nil)

// Explain says which limits hold for p on this host.
func (b *Backend) Explain(p isolation.Plan) isolation.Confinement { return b.runner.Explain(p) }

// Kill ends the agent process group named by handle.
func (b *Backend) Kill(ctx context.Context, handle string) error {
	return hostrun.Kill(ctx, handle)
}
