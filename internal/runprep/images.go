package runprep

import (
	"context"
	"fmt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/isolation"
)

// ImageEnsurer gives the tag of an agent's isolation image, building it first
// when the engine lacks it. berth-imaged answers it over D-Bus
// (busapi.Images); the options carry the caller's trace context.
type ImageEnsurer interface {
	EnsureIsolationImageWith(ctx context.Context, agent string, opts busapi.EnsureOptions) (string, error)
}

// isolationImage fills in the image of a container plan that names none
// (container_mode.image unset) with the isolation image berth-imaged makes
// for the agent, waiting for a build within the run's timeout. Without an
// ImageEnsurer the container backend builds its default image itself.
// berth-imaged's spans of the call join ctx's trace (the run's plan span).
func (p *Preparer) isolationImage(ctx context.Context, plan *isolation.Plan) error {
	// A pod runs the same isolation image, which the nodes must have.
	kube := plan.Backend == isolation.BackendKubernetes
	named := plan.Container.Image != ""
	if kube {
		named = plan.Kube.Image != ""
	}
	if plan.Backend != isolation.BackendContainer && !kube || named || p.opts.Images == nil {
		return nil
	}
	if plan.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, plan.Timeout)
		defer cancel()
	}
	tag, err := p.opts.Images.EnsureIsolationImageWith(ctx, plan.AgentID, busapi.EnsureOptions{Traceparent: tracing.Traceparent(ctx)})
	if err != nil {
		err = fmt.Errorf("cannot get the isolation image of agent %s from berth-imaged: %w", plan.AgentID, err)
		return &isolation.RunError{Reason: isolation.ReasonImageBuildFailed, Err: err}
	}
	if kube {
		plan.Kube.Image = tag
		return nil
	}
	plan.Container.Image = tag
	return nil
}
