package runprep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/services/egress"
)

// Facts are SharedFacts for a run of agentID: its run user is the agent's
// own uid (allocated on first use, uids.go) when the scheduler is root and
// [scheduler] agent_uids is not "off", and WorkspaceErr says whether that
// user can use an admin-configured workspace. An agent that is not
// configured gets the shared facts (and no uid). Explain calls it too, so
// the plan it shows names the very user the agent's runs get.
func (p *Preparer) Facts(cfg *config.Config, agentID string) runplan.HostFacts {
	host := p.SharedFacts(cfg)
	a, err := cfg.Agent(agentID)
	if err != nil || !perAgentUIDs(cfg) {
		return host
	}
	host.AgentUser = true
	host.RunUser, host.RunUserErr = nil, nil
	uid, err := p.agentUID(a.ID, cfg.Scheduler.AgentUIDs)
	if err != nil {
		host.RunUserErr = err
		return host
	}
	host.RunUser = runplan.AgentUserFor(uid)
	if a.Workspace != "" {
		host.WorkspaceErr = writableBy(runplan.WorkspaceOf(a, p.opts.StateDir), host.RunUser)
	}
	return host
}

// perAgentUIDs says whether agents run as uids of their own: only a root
// scheduler switches users at all.
func perAgentUIDs(cfg *config.Config) bool {
	return os.Geteuid() == 0 && !cfg.Scheduler.AgentUIDs.Off
}

// SharedFacts describes this scheduler and host to runplan: the state and
// config directories, the run user shared by every agent ([scheduler]
// run_as, looked up when the scheduler is root and agent_uids is "off"; a
// run's own user comes from Facts), the scheduler's own environment for
// provider keys, and whether an egress proxy can be started.
func (p *Preparer) SharedFacts(cfg *config.Config) runplan.HostFacts {
	host := runplan.HostFacts{
		StateDir:          p.opts.StateDir,
		ConfigDir:         p.opts.ConfigDir,
		Getenv:            p.opts.Getenv,
		ForceUnrestricted: p.opts.ForceUnrestricted,
	}
	if os.Geteuid() == 0 && cfg.Scheduler.AgentUIDs.Off && cfg.Scheduler.RunAs != "" {
		host.RunUser, host.RunUserErr = p.users.Lookup(cfg.Scheduler.RunAs)
	}
	host.EgressDir = p.egressRoot()
	// It exists before a plan is compiled, so a policy that carves the
	// run's own directory out of the denied state dir denies the others'.
	if err := egress.MakeRoot(host.EgressDir); err != nil {
		p.log.Warn("cannot create the egress directory", "err", err)
	}
	if fi, err := os.Stat(cfg.Scheduler.EgressBinary); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		host.EgressUnavailable = fmt.Errorf("%s is not an executable file ([scheduler] egress_binary)", cfg.Scheduler.EgressBinary)
	}
	if os.Geteuid() == 0 {
		u, err := p.users.Lookup(cfg.Scheduler.EgressUser)
		if err != nil {
			host.EgressUnavailable = errors.Join(host.EgressUnavailable, fmt.Errorf("cannot find [scheduler] egress_user: %w", err))
		}
		host.EgressUser = u
	}
	return host
}

// egressRoot holds one socket directory per run attempt.
func (p *Preparer) egressRoot() string { return filepath.Join(p.opts.StateDir, "egress") }
