package scheduler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// runOnce compiles the run's plan (internal/runplan), prepares its workspace
// and request and hands both to the plan's backend. backend is the name of
// the backend used, if any.
func (s *Service) runOnce(ctx context.Context, r Run, cfg *config.Config) (res isolation.Result, backend string, err error) {
	agent, err := cfg.Agent(r.Agent)
	if err != nil {
		return res, "", &isolation.RunError{Reason: ReasonAgentNotConfigured, Err: err}
	}
	host := s.hostFacts(cfg)
	kind := runplan.BackendOf(agent, host)
	b := s.opts.Backends[string(kind)]
	if b == nil {
		if kind == isolation.BackendContainer {
			return res, "", &isolation.RunError{Reason: ReasonContainerUnavailable}
		}
		return res, "", isolation.Errorf(ReasonNoBackend, "no backend %q in this scheduler", kind)
	}
	backend = b.Name()
	if host.RunUserErr != nil {
		return res, backend, &isolation.RunError{Reason: isolation.ReasonStart, Err: host.RunUserErr}
	}
	if _, err := s.prepareWorkspace(agent, host.RunUser); err != nil {
		return res, backend, &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	plan, err := runplan.Compile(cfg, agent.ID, r.ID, host)
	if err != nil {
		if isolation.ReasonOf(err) == "" {
			err = &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
		}
		return res, backend, err
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
		Provider:  plan.Providers[0],
		Fallback:  plan.Providers[1:],
		Policy:    plan.Policy,
		Workspace: plan.SandboxWorkspace,
		History:   s.history(r),
	}
	spec := isolation.Spec{
		Plan:    plan,
		Request: req,
		OnStart: func(handle string) error { return s.saveHandle(r.ID, backend, handle) },
	}
	res, err = b.Run(ctx, spec)
	return res, backend, err
}

// hostFacts describes this scheduler and host to runplan: the state and
// config directories, the run user (looked up when the scheduler is root and
// so switches to it), the scheduler's own environment for provider keys.
func (s *Service) hostFacts(cfg *config.Config) runplan.HostFacts {
	host := runplan.HostFacts{
		StateDir:  s.stateDir,
		ConfigDir: s.opts.ConfigDir,
		Getenv:    s.opts.Getenv,
	}
	// berth-scheduler --unrestricted serves landlock agents with the
	// unrestricted backend: their plans must say so.
	if b := s.opts.Backends[string(isolation.BackendLandlock)]; b != nil && b.Name() == string(isolation.BackendUnrestricted) {
		host.ForceUnrestricted = true
	}
	if os.Geteuid() == 0 && cfg.Scheduler.RunAs != "" {
		host.RunUser, host.RunUserErr = isolation.LookupRunUser(cfg.Scheduler.RunAs)
	}
	return host
}

// saveHandle records the sandbox handle so a restarted scheduler can kill
// it. An error ends the run (isolation.Supervise kills the sandbox): a
// sandbox nobody could find after a crash must not keep running.
func (s *Service) saveHandle(runID, backend, handle string) error {
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRun(tx, runID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("run %s is not in %s", runID, DBName)
		}
		r.Backend, r.Handle = backend, handle
		return putRun(tx, r)
	})
	if err != nil {
		s.log.Error("cannot record sandbox handle; ending the run", "run_id", runID, "backend", backend, "handle", handle, "err", err)
		return fmt.Errorf("cannot record sandbox handle: %w", err)
	}
	return nil
}

// prepareWorkspace makes the agent's workspace (0700, owned by the run user
// when the scheduler is root). An existing configured workspace is left as
// the admin made it.
func (s *Service) prepareWorkspace(a config.Agent, runUser *isolation.RunUser) (string, error) {
	ws := runplan.WorkspaceOf(a, s.stateDir)
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
		if err := os.Chown(ws, int(runUser.UID), int(runUser.GID)); err != nil {
			return "", fmt.Errorf("cannot hand workspace %s to %s: %w", ws, runUser.Name, err)
		}
	}
	return ws, nil
}
