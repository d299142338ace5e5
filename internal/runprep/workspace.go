package runprep

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/workspace"
)

// readyWorkspace makes the agent's workspace ready for a run as runUser,
// its quota enforced (prepareWorkspace, then enforceWorkspaceQuota). The
// error is a *isolation.RunError.
func (p *Preparer) readyWorkspace(ctx context.Context, cfg *config.Config, a config.Agent, runUser *isolation.RunUser) error {
	ws, err := p.prepareWorkspace(a, runUser)
	if err != nil {
		return &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	return p.enforceWorkspaceQuota(ctx, cfg, a, ws)
}

// prepareWorkspace makes the agent's workspace (0700) and, when the
// scheduler is root, hands it to the run user. A workspace at the default
// location that the run user does not own (berth ran the agent as a shared
// run_as before, or the agent's uid changed) is handed over whole. An
// existing admin-configured workspace is left as the admin made it, but a
// run user that cannot write it fails the run, saying so.
func (p *Preparer) prepareWorkspace(a config.Agent, runUser *isolation.RunUser) (string, error) {
	ws := runplan.WorkspaceOf(a, p.opts.StateDir)
	defaultLocation := a.Workspace == ""
	if defaultLocation {
		agentsDir := filepath.Dir(ws)
		if !dirHasMode(agentsDir, 0o755) {
			if err := os.MkdirAll(agentsDir, 0o755); err != nil {
				return "", fmt.Errorf("cannot create %s: %w", agentsDir, err)
			}
			if err := os.Chmod(agentsDir, 0o755); err != nil {
				return "", fmt.Errorf("cannot set mode of %s: %w", agentsDir, err)
			}
		}
	}
	err := os.Mkdir(ws, 0o700)
	created := err == nil
	if err != nil && !errors.Is(err, os.ErrExist) {
		if err = os.MkdirAll(ws, 0o700); err != nil {
			return "", fmt.Errorf("cannot create workspace %s: %w", ws, err)
		}
		created = true
	}
	if !created && !defaultLocation {
		if runUser != nil {
			if err := writableBy(ws, runUser); err != nil {
				return "", err
			}
		}
		return ws, nil
	}
	fi, err := os.Lstat(ws)
	if err != nil {
		return "", fmt.Errorf("cannot inspect workspace %s: %w", ws, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("workspace %s is not a directory", ws)
	}
	if !modeIs(fi, 0o700) {
		if err := os.Chmod(ws, 0o700); err != nil {
			return "", fmt.Errorf("cannot set mode of workspace %s: %w", ws, err)
		}
	}
	if runUser == nil {
		return ws, nil
	}
	if created {
		if err := os.Chown(ws, int(runUser.UID), int(runUser.GID)); err != nil {
			return "", fmt.Errorf("cannot hand workspace %s to uid %d: %w", ws, runUser.UID, err)
		}
		return ws, nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == runUser.UID && st.Gid == runUser.GID {
		return ws, nil
	}
	skipped, err := handOver(ws, runUser)
	if err != nil {
		return "", err
	}
	p.log.Info("workspace handed to the agent's run user", "agent", a.ID, "uid", runUser.UID, "workspace", ws, "skipped_hard_links", skipped)
	return ws, nil
}

// dirHasMode says whether path (followed, as MkdirAll and Chmod do) is a
// directory whose mode is exactly mode (no set-id or sticky bit either).
// Every run prepares its workspace; a chmod to the mode it has would still
// dirty the inode (its ctime), and the workspace's root may be a quota
// image's.
func dirHasMode(path string, mode uint32) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir() && modeIs(fi, mode)
}

func modeIs(fi fs.FileInfo, mode uint32) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Mode&0o7777 == mode
}

// handOver chowns the workspace ws and everything in it to u, never
// following a symbolic link. A regular file with more than one link is
// left alone: its other names may lie outside the workspace. skipped
// counts those.
func handOver(ws string, u *isolation.RunUser) (skipped int, err error) {
	err = filepath.WalkDir(ws, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
					skipped++
					return nil
				}
			}
		}
		return os.Lchown(path, int(u.UID), int(u.GID))
	})
	if err != nil {
		return skipped, fmt.Errorf("cannot hand workspace %s to uid %d: %w", ws, u.UID, err)
	}
	return skipped, nil
}

// writableBy says, as a run error's cause, why u cannot create files in the
// directory ws (by its owner, group and mode; ACLs are not read). nil when
// it can, or when ws does not exist yet (the run creates it).
func writableBy(ws string, u *isolation.RunUser) error {
	fi, err := os.Stat(ws)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot inspect workspace %s: %w", ws, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	mode := fi.Mode().Perm()
	var can bool
	switch {
	case st.Uid == u.UID:
		can = mode&0o300 == 0o300
	case st.Gid == u.GID || slices.Contains(u.Groups, st.Gid):
		can = mode&0o030 == 0o030
	default:
		can = mode&0o003 == 0o003
	}
	if !fi.IsDir() || !can {
		return fmt.Errorf("workspace %s (the agent's workspace setting) is owned by %d:%d with mode %04o, so the agent's user %s (uid %d) cannot write it; berth leaves a configured workspace as the admin made it: chown -R %d:%d %s, or remove the setting to use one berth manages",
			ws, st.Uid, st.Gid, mode, u.Name, u.UID, u.UID, u.GID, ws)
	}
	return nil
}

// enforceWorkspaceQuota makes the agent's workspace ws hold at most the
// agent's workspace_quota before a run uses it: its own ext4 image,
// loop-mounted there (isolation/workspace). The run user owns the
// workspace's root (prepareWorkspace made it so before). An error fails the
// run closed.
func (p *Preparer) enforceWorkspaceQuota(ctx context.Context, cfg *config.Config, a config.Agent, ws string) error {
	if a.WorkspaceQuota == 0 {
		return nil
	}
	err := p.opts.QuotaRefusal
	if err != nil {
		err = fmt.Errorf("cannot enforce workspace_quota %s on %s: %w", workspace.Size(int64(a.WorkspaceQuota)), ws, err)
	} else {
		systemd := hostrun.SystemdAvailable()
		p.sweepWorkspacesOnce(ctx, cfg, systemd)
		err = workspace.Ensure(ctx, workspace.Options{
			Dir:     ws,
			Image:   workspace.ImagePath(p.opts.StateDir, a.ID),
			Bytes:   int64(a.WorkspaceQuota),
			Systemd: systemd,
			Logger:  p.log.With("agent", a.ID),
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
func (p *Preparer) sweepWorkspacesOnce(ctx context.Context, cfg *config.Config, systemd bool) {
	if cfg == nil || p.workspacesSweptFor.Swap(cfg) == cfg {
		return
	}
	workspace.SweepDeleted(ctx, p.workspaceImages(), systemd, p.log)
}

// ReleaseWorkspaces unmounts the workspace images this scheduler mounted
// itself (without systemd), so its state directory can be removed; under
// systemd the mount units stay, as the runs' units do. The images stay.
func (p *Preparer) ReleaseWorkspaces() error {
	if hostrun.SystemdAvailable() {
		return nil
	}
	return workspace.Release(p.workspaceImages())
}

// workspaceImages is the directory of the agents' workspace images.
func (p *Preparer) workspaceImages() string {
	return filepath.Dir(workspace.ImagePath(p.opts.StateDir, ""))
}
