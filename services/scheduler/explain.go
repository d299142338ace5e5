package scheduler

import (
	"context"
	"errors"

	"github.com/godbus/dbus/v5"
)

// ExplainAgentJSON is the run plan the scheduler would use for agent's next
// run, as JSON (dev.berth.Scheduler1.ExplainAgent).
func (s *Service) ExplainAgentJSON(agent string) (string, error) {
	return "", errors.New("not implemented yet")
}

// TestProviders checks providers with the scheduler's own environment
// (dev.berth.Scheduler1.TestProviders); name "" means every provider.
func (s *Service) TestProviders(name string) ([]map[string]dbus.Variant, error) {
	_ = context.Background
	return nil, errors.New("not implemented yet")
}
