package scheduler

import (
	"context"
	"fmt"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/isolation"
)

// ImageEnsurer gives the tag of an agent's isolation image, building it first
// when the engine lacks it. berth-imaged answers it over D-Bus (BusImages).
type ImageEnsurer interface {
	EnsureIsolationImage(ctx context.Context, agent string) (string, error)
}

// isolationImage fills in the image of a container plan that names none
// (container_mode.image unset) with the isolation image berth-imaged makes
// for the agent, waiting for a build within the run's timeout. Without an
// ImageEnsurer the container backend builds its default image itself.
func (s *Service) isolationImage(ctx context.Context, plan *isolation.Plan) error {
	if plan.Backend != isolation.BackendContainer || plan.Container.Image != "" || s.opts.Images == nil {
		return nil
	}
	if plan.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, plan.Timeout)
		defer cancel()
	}
	tag, err := s.opts.Images.EnsureIsolationImage(ctx, plan.AgentID)
	if err != nil {
		return &isolation.RunError{Reason: isolation.ReasonImageBuildFailed, Err: err}
	}
	plan.Container.Image = tag
	return nil
}

// BusImages asks dev.berth.Images1 on conn; the call D-Bus-activates
// berth-imaged when it is not running.
type BusImages struct{ Conn *dbus.Conn }

func (b BusImages) EnsureIsolationImage(ctx context.Context, agent string) (string, error) {
	var tag string
	call := b.Conn.Object(bus.ImagesName, bus.ImagesPath).CallWithContext(ctx, bus.ImagesInterface+".EnsureIsolationImage", 0, agent)
	if err := call.Store(&tag); err != nil {
		return "", fmt.Errorf("cannot get the isolation image of agent %s from berth-imaged: %w", agent, err)
	}
	return tag, nil
}
