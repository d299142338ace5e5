package scheduler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// runOnce prepares the run's workspace and request and hands it to the
// agent's backend. backend is the name of the backend used, if any.
func (s *Service) runOnce(ctx context.Context, r Run, cfg *config.Config) (res isolation.Result, backend string, err error) {
	agent, err := cfg.Agent(r.Agent)
	if err != nil {
		return res, "", &isolation.RunError{Reason: ReasonAgentNotConfigured, Err: err}
	}
	b := s.opts.Backends[agent.Isolation]
	if b == nil {
		if agent.Isolation == "container" {
			return res, "", &isolation.RunError{Reason: ReasonContainerUnavailable}
		}
		return res, "", isolation.Errorf(ReasonNoBackend, "no backend %q in this scheduler", agent.Isolation)
	}
	backend = b.Name()
	runUser, err := s.runUser(cfg)
	if err != nil {
		return res, backend, &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	workspace, err := s.prepareWorkspace(agent, runUser)
	if err != nil {
		return res, backend, &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	chain, err := cfg.ProviderChain(agent, s.opts.Getenv)
	if err != nil {
		return res, backend, &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	if len(chain) == 0 {
		return res, backend, isolation.Errorf(isolation.ReasonStart, "agent %s has no provider", agent.ID)
	}
	if err := checkProviderNetwork(agent, chain); err != nil {
		return res, backend, err
	}
	var policyOpts []isolation.PolicyOption
	if runUser != nil {
		policyOpts = append(policyOpts, isolation.RunUserHome(runUser.HomeDir))
	}
	req := agentproto.Request{
		Version: agentproto.Version,
		RunID:   r.ID,
		Agent: agentproto.Agent{
			ID:            agent.ID,
			Name:          agent.Name,
			MaxIterations: agent.MaxIterations,
			Tools:         agentproto.Tools{Allow: agent.Tools.Allow, Deny: agent.Tools.Deny},
		},
		Message: agentproto.Message{
			ID:          r.MessageID,
			Connector:   r.Connector,
			Channel:     r.Channel,
			ChannelName: r.ChannelName,
			Thread:      r.Thread,
			Author:      r.Author,
			Text:        r.Text,
			ReceivedAt:  r.CreatedAt,
		},
		Provider:  chain[0],
		Fallback:  chain[1:],
		Policy:    isolation.HostPolicy(agent, workspace, s.protectedPaths(cfg, agent, workspace), policyOpts...),
		Workspace: workspace,
		History:   s.history(r),
	}
	spec := isolation.Spec{
		RunID:       r.ID,
		AgentID:     agent.ID,
		Request:     req,
		Workspace:   workspace,
		AgentBinary: cfg.Scheduler.AgentBinary,
		RunAs:       cfg.Scheduler.RunAs,
		Timeout:     agent.Timeout,
		Container:   agent.Container,
		OnStart:     func(handle string) { s.saveHandle(r.ID, backend, handle) },
	}
	res, err = b.Run(ctx, spec)
	return res, backend, err
}

// saveHandle records the sandbox handle so a restarted scheduler can kill it.
func (s *Service) saveHandle(runID, backend, handle string) {
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRun(tx, runID)
		if err != nil || !ok {
			return err
		}
		r.Backend, r.Handle = backend, handle
		return putRun(tx, r)
	})
	if err != nil {
		s.log.Error("cannot record sandbox handle", "run", runID, "handle", handle, "err", err)
	}
}

// runUser looks up [scheduler] run_as when the scheduler runs as root (it
// then owns the workspaces); otherwise nil.
func (s *Service) runUser(cfg *config.Config) (*user.User, error) {
	if os.Geteuid() != 0 || cfg.Scheduler.RunAs == "" {
		return nil, nil
	}
	u, err := user.Lookup(cfg.Scheduler.RunAs)
	if err != nil {
		return nil, fmt.Errorf("cannot find run user %s: %w", cfg.Scheduler.RunAs, err)
	}
	return u, nil
}

// workspaceOf is the agent's configured workspace or <state>/agents/<id>.
func (s *Service) workspaceOf(a config.Agent) string {
	if a.Workspace != "" {
		return filepath.Clean(a.Workspace)
	}
	return filepath.Join(s.stateDir, "agents", a.ID)
}

// prepareWorkspace makes the agent's workspace (0700, owned by the run user
// when the scheduler is root). An existing configured workspace is left as
// the admin made it.
func (s *Service) prepareWorkspace(a config.Agent, runUser *user.User) (string, error) {
	ws := s.workspaceOf(a)
	defaultLocation := a.Workspace == ""
	if defaultLocation {
		agentsDir := filepath.Dir(ws)
		if err := os.MkdirAll(agentsDir, 0o755); err != nil {
			return "", fmt.Errorf("cannot create %s: %w", agentsDir, err)
		}
		if err := os.Chmod(agentsDir, 0o755); err != nil {
			return "", fmt.Errorf("cannot set mode of %s: %w", agentsDir, err)
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
		return ws, nil
	}
	if err := os.Chmod(ws, 0o700); err != nil {
		return "", fmt.Errorf("cannot set mode of workspace %s: %w", ws, err)
	}
	if runUser != nil {
		uid, _ := strconv.Atoi(runUser.Uid)
		gid, _ := strconv.Atoi(runUser.Gid)
		if err := os.Chown(ws, uid, gid); err != nil {
			return "", fmt.Errorf("cannot hand workspace %s to %s: %w", ws, runUser.Username, err)
		}
	}
	return ws, nil
}

// protectedPaths are what an agent must never reach even when its
// file_access allows a parent: the state dir (and intake's beside it), the
// config dir, connector secret files and the other agents' workspaces.
// isolation.HostPolicy keeps the agent's own workspace reachable when one of
// them contains it.
func (s *Service) protectedPaths(cfg *config.Config, a config.Agent, workspace string) []string {
	protect := []string{s.stateDir, filepath.Join(filepath.Dir(s.stateDir), "intake")}
	for _, c := range cfg.Connectors {
		if c.SecretFile != "" && !slices.Contains(protect, c.SecretFile) {
			protect = append(protect, c.SecretFile)
		}
	}
	if s.opts.ConfigDir != "" {
		protect = append(protect, s.opts.ConfigDir)
	} else {
		for _, src := range cfg.Sources {
			if dir := filepath.Dir(src); !slices.Contains(protect, dir) {
				protect = append(protect, dir)
			}
		}
	}
	for _, other := range cfg.Agents {
		if other.ID == a.ID {
			continue
		}
		oa, err := cfg.Agent(other.ID)
		if err != nil {
			continue
		}
		if ws := s.workspaceOf(oa); ws != workspace && !slices.Contains(protect, ws) {
			protect = append(protect, ws)
		}
	}
	return protect
}
