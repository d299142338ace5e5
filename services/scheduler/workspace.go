package scheduler

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/workspace"
)

// enforceWorkspaceQuota makes the agent's workspace ws hold at most the
// agent's workspace_quota before a run uses it: its own ext4 image,
// loop-mounted there (isolation/workspace). runUser owns the workspace's
// root (prepareWorkspace made it so before). An error fails the run closed.
func (s *Service) enforceWorkspaceQuota(ctx context.Context, a config.Agent, ws string, runUser *isolation.RunUser) error {
	if a.WorkspaceQuota == 0 {
		return nil
	}
	err := workspaceRefusal(s.stateDir)
	if err != nil {
		err = fmt.Errorf("cannot enforce workspace_quota %s on %s: %w", workspace.Size(int64(a.WorkspaceQuota)), ws, err)
	} else {
		systemd := hostrun.SystemdAvailable()
		s.sweepWorkspacesOnce(ctx, systemd)
		err = workspace.Ensure(ctx, workspace.Options{
			Dir:     ws,
			Image:   workspace.ImagePath(s.stateDir, a.ID),
			Bytes:   int64(a.WorkspaceQuota),
			Systemd: systemd,
			Logger:  s.log.With("agent", a.ID),
		})
	}
	if err != nil {
		// The error names workspace_quota and why; the run fails closed.
		return &isolation.RunError{Reason: isolation.ReasonConfinement, Err: err}
	}
	return nil
}

// sweepWorkspacesOnce unmounts the images deleted while mounted (an agent
// removed with its image) once per config, so at the first quota run after
// a start or a reload: a run whose own image is mounted as it was confirms
// it with a few stats (workspace.Ensure) and reads no mount table.
func (s *Service) sweepWorkspacesOnce(ctx context.Context, systemd bool) {
	cfg := s.cfg.Load()
	if cfg == nil || s.workspacesSweptFor.Swap(cfg) == cfg {
		return
	}
	workspace.SweepDeleted(ctx, filepath.Dir(workspace.ImagePath(s.stateDir, "")), systemd, s.log)
}

// releaseWorkspaces unmounts the workspace images this scheduler mounted
// itself (without systemd), so its state directory can be removed; under
// systemd the mount units stay, as the runs' units do. The images stay.
func (s *Service) releaseWorkspaces() error {
	if hostrun.SystemdAvailable() {
		return nil
	}
	return workspace.Release(filepath.Dir(workspace.ImagePath(s.stateDir, "")))
}

// workspaceRefusals is a seam for tests that can only make quotas fail:
// state directory → why the quota of its scheduler cannot be enforced.
var workspaceRefusals sync.Map

func workspaceRefusal(stateDir string) error {
	if v, ok := workspaceRefusals.Load(stateDir); ok {
		return v.(error)
	}
	return nil
}

// workspaceWhy explains an agent's workspace quota (sandbox explain).
func workspaceWhy(a config.Agent, stateDir string) string {
	return workspace.Why(int64(a.WorkspaceQuota), workspace.ImagePath(stateDir, a.ID))
}
