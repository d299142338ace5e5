package scheduler

import (
	"context"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// enforceWorkspaceQuota makes the agent's workspace ws hold at most the
// agent's workspace_quota before a run uses it. runUser owns the
// workspace's root.
func (s *Service) enforceWorkspaceQuota(ctx context.Context, a config.Agent, ws string, runUser *isolation.RunUser) error {
	return nil
}
