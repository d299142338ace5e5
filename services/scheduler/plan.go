package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// runOnce compiles the run's plan (internal/runplan), prepares its workspace
// and request and hands both to the plan's backend. backend is the name of
// the backend used, if any.
func (s *Service) runOnce(ctx context.Context, r Run, cfg *config.Config) (res isolation.Result, backend string, err error) {
	agent, err := cfg.Agent(r.Agent)
	if err != nil {
		return res, "", &isolation.RunError{Reason: isolation.ReasonAgentNotConfigured, Err: err}
	}
	host := s.agentFacts(cfg, agent.ID)
	plan, b, err := s.prepareRun(ctx, cfg, agent, r.ID, r.Attempt, host)
	if b != nil {
		backend = b.Name()
	}
	if err != nil {
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
		OnStart: func(handle string) error {
			s.hold(ctx, HoldBeforeHandle, r)
			if err := s.saveHandle(r.ID, backend, handle); err != nil {
				return err
			}
			s.hold(ctx, HoldBeforeAnswer, r)
			return nil
		},
	}
	if plan.Network.Allowed {
		s.log.Warn("run has a direct, unfiltered network (an admin's opt-in); its provider keys travel on stdin",
			"run_id", r.ID, "agent", agent.ID, "backend", backend, "network", plan.Network.Mode)
	}
	if plan.Egress != nil {
		proxy, token, err := s.startEgress(ctx, plan, host)
		if err != nil {
			return res, backend, err
		}
		spec.EgressToken = token
		defer func() {
			// The run is over: its token dies with its proxy.
			rec := proxy.Stop()
			res.Egress, res.EgressDropped, res.EgressCounts = rec.Decisions, rec.Dropped, rec.Counts
		}()
	}
	res, err = b.Run(ctx, spec)
	return res, backend, err
}

// prepareRun compiles a run's plan, picks its backend and readies its
// workspace and image: what a message's run and a provider check's run
// share. b is set once the backend is known, even when err is not nil.
func (s *Service) prepareRun(ctx context.Context, cfg *config.Config, agent config.Agent, runID string, attempt int, host runplan.HostFacts) (plan isolation.Plan, b isolation.Backend, err error) {
	// Compile alone chooses the backend; a refused plan still names it, and
	// a missing backend is said before the plan's own problems.
	plan, compileErr := runplan.CompileAttempt(cfg, agent.ID, runID, attempt, host)
	b, err = s.backendFor(plan.Backend)
	if err != nil {
		if plan.Backend == "" {
			err = compileErr
		}
		return plan, nil, err
	}
	if host.RunUserErr != nil {
		return plan, b, &isolation.RunError{Reason: isolation.ReasonStart, Err: host.RunUserErr}
	}
	if err := s.readyWorkspace(ctx, agent, host.RunUser); err != nil {
		return plan, b, err
	}
	if err := compileErr; err != nil {
		if isolation.ReasonOf(err) == "" {
			err = &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
		}
		return plan, b, err
	}
	if err := s.isolationImage(ctx, &plan); err != nil {
		return plan, b, err
	}
	return plan, b, nil
}

// startEgress starts the run's egress proxy as [scheduler] egress_user on
// the run's socket, holding the provider keys the request no longer carries.
func (s *Service) startEgress(ctx context.Context, plan isolation.Plan, host runplan.HostFacts) (*egress.Proxy, string, error) {
	token, err := egress.NewToken()
	if err != nil {
		return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	pol := egress.Policy{RunID: plan.RunID, Agent: plan.AgentID, Token: token, Allow: plan.Egress.Allow}
	for _, ep := range plan.Egress.Providers {
		for _, pr := range plan.Providers {
			if pr.Name == ep.Name {
				ep.Key = pr.Key
				pol.Providers = append(pol.Providers, ep)
			}
		}
	}
	var bundle []byte
	if len(plan.Egress.Secrets) > 0 {
		// A CA for this run only, for its secrets' hosts only, for as long as
		// the run may last: its key lives in the proxy while the run lasts.
		var hosts []string
		for _, sec := range plan.Egress.Secrets {
			hosts = append(hosts, sec.Hosts...)
		}
		ca, err := egress.NewCA(plan.RunID, hosts, egress.CALifetime(plan.Timeout+plan.KillGrace))
		if err != nil {
			return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
		}
		pol.CA, bundle = &ca, ca.Bundle()
		pol.Secrets = slices.Clone(plan.Egress.Secrets)
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	proxy, err := egress.Launch(startCtx, pol, egress.LaunchOptions{
		Binary:   plan.Egress.Proxy.Binary,
		User:     host.EgressUser,
		Client:   host.RunUser,
		Socket:   plan.Egress.Socket,
		Logger:   s.log,
		CABundle: bundle,
		// Private CAs the admin gave the scheduler hold for upstreams too.
		UpstreamCAFile: s.opts.Getenv("SSL_CERT_FILE"),
		Confine:        s.confineEgress(ctx, plan),
		MemoryMax:      int64(egressProxyLimits.MemoryMax),
	})
	if err != nil {
		return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start the run's egress proxy", Err: err}
	}
	return proxy, token, nil
}

// agentFacts are hostFacts for a run of agentID: its run user is the
// agent's own uid (allocated on first use, uids.go) when the scheduler is
// root and [scheduler] agent_uids is not "off", and WorkspaceErr says
// whether that user can use an admin-configured workspace. An agent that
// is not configured gets the shared facts (and no uid).
func (s *Service) agentFacts(cfg *config.Config, agentID string) runplan.HostFacts {
	host := s.hostFacts(cfg)
	a, err := cfg.Agent(agentID)
	if err != nil || !s.perAgentUIDs(cfg) {
		return host
	}
	host.AgentUser = true
	host.RunUser, host.RunUserErr = nil, nil
	uid, err := s.agentUID(a.ID, runplan.AgentUIDs(cfg))
	if err != nil {
		host.RunUserErr = err
		return host
	}
	host.RunUser = runplan.AgentUserFor(uid)
	if a.Workspace != "" {
		host.WorkspaceErr = writableBy(runplan.WorkspaceOf(a, s.stateDir), host.RunUser)
	}
	return host
}

// perAgentUIDs says whether agents run as uids of their own: only a root
// scheduler switches users at all.
func (s *Service) perAgentUIDs(cfg *config.Config) bool {
	return os.Geteuid() == 0 && !cfg.Scheduler.AgentUIDs.Off
}

// hostFacts describes this scheduler and host to runplan: the state and
// config directories, the run user shared by every agent ([scheduler]
// run_as, looked up when the scheduler is root and agent_uids is "off"; a
// run's own user comes from agentFacts), the scheduler's own environment
// for provider keys.
func (s *Service) hostFacts(cfg *config.Config) runplan.HostFacts {
	host := runplan.HostFacts{
		StateDir:          s.stateDir,
		ConfigDir:         s.opts.ConfigDir,
		Getenv:            s.opts.Getenv,
		ForceUnrestricted: s.opts.ForceUnrestricted,
	}
	if os.Geteuid() == 0 && cfg.Scheduler.AgentUIDs.Off && cfg.Scheduler.RunAs != "" {
		host.RunUser, host.RunUserErr = runUsers.Lookup(cfg.Scheduler.RunAs)
	}
	host.EgressDir = filepath.Join(s.stateDir, "egress")
	// It exists before a plan is compiled, so a policy that carves the
	// run's own directory out of the denied state dir denies the others'.
	if err := egress.MakeRoot(host.EgressDir); err != nil {
		s.log.Warn("cannot create the egress directory", "err", err)
	}
	if fi, err := os.Stat(cfg.Scheduler.EgressBinary); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		host.EgressUnavailable = fmt.Errorf("%s is not an executable file ([scheduler] egress_binary)", cfg.Scheduler.EgressBinary)
	}
	if os.Geteuid() == 0 {
		u, err := runUsers.Lookup(cfg.Scheduler.EgressUser)
		if err != nil {
			host.EgressUnavailable = errors.Join(host.EgressUnavailable, fmt.Errorf("cannot find [scheduler] egress_user: %w", err))
		}
		host.EgressUser = u
	}
	return host
}

// backendFor is the backend a compiled plan runs on, or why this scheduler
// has none.
func (s *Service) backendFor(kind isolation.BackendKind) (isolation.Backend, error) {
	if b := s.opts.Backends[string(kind)]; b != nil {
		return b, nil
	}
	if kind == isolation.BackendContainer {
		return nil, &isolation.RunError{Reason: isolation.ReasonContainerUnavailable}
	}
	return nil, isolation.Errorf(isolation.ReasonNoBackend, "no backend %q in this scheduler", kind)
}

// saveHandle records the sandbox handle so a restarted scheduler can kill
// it. An error ends the run (isolation.Supervise kills the sandbox): a
// sandbox nobody could find after a crash must not keep running.
func (s *Service) saveHandle(runID, backend, handle string) error {
	// Through the committer: it reads the run and writes it back, so it may
	// be applied again with its group.
	err := s.store.write(func(tx *bolt.Tx) error {
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

// readyWorkspace makes the agent's workspace ready for a run as runUser,
// its quota enforced (prepareWorkspace, then enforceWorkspaceQuota). The
// error is a *isolation.RunError.
func (s *Service) readyWorkspace(ctx context.Context, a config.Agent, runUser *isolation.RunUser) error {
	ws, err := s.prepareWorkspace(a, runUser)
	if err != nil {
		return &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	return s.enforceWorkspaceQuota(ctx, a, ws, runUser)
}

// prepareWorkspace makes the agent's workspace (0700) and, when the
// scheduler is root, hands it to the run user. A workspace at the default
// location that the run user does not own (berth ran the agent as a shared
// run_as before, or the agent's uid changed) is handed over whole. An
// existing admin-configured workspace is left as the admin made it, but a
// run user that cannot write it fails the run, saying so.
func (s *Service) prepareWorkspace(a config.Agent, runUser *isolation.RunUser) (string, error) {
	ws := runplan.WorkspaceOf(a, s.stateDir)
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
	s.log.Info("workspace handed to the agent's run user", "agent", a.ID, "uid", runUser.UID, "workspace", ws, "skipped_hard_links", skipped)
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
