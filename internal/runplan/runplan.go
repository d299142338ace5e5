// Package runplan compiles what one run's sandbox is made of — backend,
// policy, limits, network, mounts, run user, image, provider chain and
// timeouts — from the config, the agent id and facts about the host, into an
// isolation.Plan. It is the one place these decisions are made: the
// scheduler runs the plan it compiles, and `berthctl sandbox explain` shows
// the same plan, with a reason for each decision (Explain).
//
// Compile touches nothing: the host is described by HostFacts. The only
// reads of the filesystem are HostPolicy's (which system paths exist, and the
// entries of a denied directory that holds the workspace).
package runplan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/workspace"
)

// The limits berth.toml has no key for are defaulted here and nowhere else
// (memory is the resolved config's, config.DefaultMemoryLimit); a backend
// refuses a plan that lacks one instead of defaulting it again.
const (
	DefaultPids     = 256
	DefaultNanoCPUs = 1_000_000_000 // one CPU
	DefaultTmpfs    = 256 << 20     // the container's /tmp
	// KillGrace is how long an ended agent's output is drained.
	KillGrace = 2 * time.Second
)

// HostFacts are what a plan needs to know about the host and the scheduler.
type HostFacts struct {
	// StateDir is the scheduler's state directory.
	StateDir string
	// ConfigDir is protected from agents; "" means the directories of the
	// loaded config files (Config.Sources).
	ConfigDir string
	// RunUser is the user the agent runs as when the scheduler switches
	// users (it is root); nil otherwise (the agent runs as the scheduler).
	// With AgentUser it is the agent's own uid, allocated from [scheduler]
	// agent_uids (AgentUserFor); without, [scheduler] run_as looked up on
	// this host. RunUserErr is why neither could be had.
	RunUser    *isolation.RunUser
	RunUserErr error
	AgentUser  bool
	// WorkspaceErr says why the run user cannot use the agent's workspace
	// (an admin-configured one it cannot write); the run is refused.
	WorkspaceErr error
	// Systemd says host runs become transient units (for Explain).
	Systemd bool
	// ForceUnrestricted: every landlock agent runs unrestricted
	// (berth-scheduler --unrestricted).
	ForceUnrestricted bool
	// Getenv reads provider keys (api_key_env) in the scheduler's own
	// environment.
	Getenv func(string) string
	// EgressDir holds the runs' egress sockets (one directory per run);
	// "" is <StateDir>/egress.
	EgressDir string
	// EgressUser is [scheduler] egress_user looked up, when the scheduler
	// is root (nil otherwise: the proxy then runs as the scheduler's user).
	EgressUser *isolation.RunUser
	// EgressUnavailable says why no egress proxy can be started here (the
	// binary or the user is missing); nil when one can.
	EgressUnavailable error
}

// Explanation is a plan with the reason for each decision, and what would
// refuse the run before it starts. It holds no secret.
type Explanation struct {
	Plan isolation.Plan `json:"plan"`
	// Why maps a decision ("backend", "limits", "network", ...) to why.
	Why map[string]string `json:"why"`
	// Problems would fail the run before it starts (a missing key, a
	// provider that needs a network the agent does not have).
	Problems []string `json:"problems,omitempty"`
}

// Compile returns the plan of a run of agentID. A run that could not start
// (unknown agent, missing key, provider without network) is refused with an
// *isolation.RunError; the refused plan still names its Backend (empty for
// an unknown agent), so the run's record says where it would have run.
func Compile(cfg *config.Config, agentID, runID string, host HostFacts) (isolation.Plan, error) {
	return CompileAttempt(cfg, agentID, runID, 0, host)
}

// CompileAttempt is Compile for the run's start number attempt: the plan
// carries it, and it names the run's egress directory
// (isolation.AttemptName), so a dead attempt's is told from the live one's.
func CompileAttempt(cfg *config.Config, agentID, runID string, attempt int, host HostFacts) (isolation.Plan, error) {
	return CompileWith(cfg, agentID, runID, attempt, Overrides{}, host)
}

// Explain returns the plan a run of agentID would get, without keys, and why.
func Explain(cfg *config.Config, agentID string, host HostFacts) (Explanation, error) {
	return ExplainWith(cfg, agentID, Overrides{}, host)
}

type compiled struct {
	plan     isolation.Plan
	why      map[string]string
	problems []*isolation.RunError
}

func compileWith(cfg *config.Config, agentID, runID string, attempt int, ov Overrides, host HostFacts) (compiled, error) {
	if cfg == nil {
		return compiled{}, errors.New("cannot compile a run plan: no configuration")
	}
	a, err := cfg.Agent(agentID)
	if err != nil {
		return compiled{}, &isolation.RunError{Reason: isolation.ReasonAgentNotConfigured, Err: err}
	}
	ov.apply(&a)
	c := compiled{why: map[string]string{}}
	p := &c.plan
	p.RunID, p.Attempt, p.AgentID = runID, attempt, a.ID
	p.AgentBinary = cfg.Scheduler.AgentBinary
	p.RunAs = cfg.Scheduler.RunAs
	p.User = host.RunUser
	p.Timeout = a.Timeout
	p.KillGrace = KillGrace
	p.Workspace = WorkspaceOf(a, host.StateDir)
	c.why["workspace"] = workspace.Why(int64(a.WorkspaceQuota), workspace.ImagePath(host.StateDir, a.ID))
	c.why["timeout"] = fmt.Sprintf("%s: container_mode.timeout_seconds, else [scheduler] default_timeout_seconds; then the sandbox is killed (reason %q)", a.Timeout, isolation.ReasonTimeout)
	c.why["user"] = userWhy(cfg, host)
	if host.RunUser != nil && host.AgentUser {
		p.RunAs = host.RunUser.Name
	}
	if host.RunUserErr != nil {
		c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Err: host.RunUserErr})
	}
	if host.WorkspaceErr != nil {
		c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Err: host.WorkspaceErr})
	}

	// Read and defaulted once, by config; a zero limit is refused by the backend.
	memory := int64(a.Container.MemoryLimit)
	p.Limits = isolation.Limits{MemoryBytes: memory, Pids: DefaultPids, NanoCPUs: DefaultNanoCPUs,
		RlimitFallback: cfg.Scheduler.AllowRlimitFallback, WorkspaceBytes: int64(a.WorkspaceQuota)}
	memoryWhy := fmt.Sprintf("memory %s (container_mode.memory_limit, for host runs too), %d processes, 1 CPU", isolation.FormatBytes(memory), DefaultPids)

	// The one place a run's backend is chosen: the scheduler runs the plan
	// on the backend it names.
	p.Backend = BackendOf(a, host.ForceUnrestricted)
	switch p.Backend {
	case isolation.BackendContainer:
		c.why["backend"] = "container — container_mode.enabled = true: a fresh Docker container per message, removed afterwards"
		containerPlan(&c, a)
		p.Limits.TmpfsBytes = DefaultTmpfs
		c.why["limits"] = memoryWhy + fmt.Sprintf(", no extra swap; tmpfs %s %s", isolation.ContainerTmp, isolation.FormatBytes(DefaultTmpfs))
	case isolation.BackendKubernetes:
		kubePlan(&c, cfg, a) // kube.go
	default:
		switch {
		case p.Backend == isolation.BackendLandlock:
			c.why["backend"] = "landlock — the default: berth-agent confines itself with Landlock on the host (container_mode.enabled is false)"
		case a.Isolation == string(isolation.BackendUnrestricted):
			c.why["backend"] = "unrestricted — file_access.unrestricted = true: a plain host process with NO file confinement (logged on every run)"
		default:
			c.why["backend"] = "unrestricted — berth-scheduler runs with --unrestricted: every landlock agent runs with NO file confinement"
		}
		fa := a.FileAccess
		hostAccess := isolation.FileAccess{
			Unrestricted:      fa.Unrestricted || p.Backend == isolation.BackendUnrestricted,
			AllowRead:         fa.AllowRead,
			AllowReadWrite:    fa.AllowReadWrite,
			Deny:              fa.Deny,
			AllowHomeDotfiles: fa.AllowHomeDotfiles,
			AllowNetwork:      fa.AllowNetwork,
		}
		p.SandboxWorkspace = p.Workspace
		p.Protected = ProtectedPaths(cfg, a, host)
		var opts []isolation.PolicyOption
		if host.RunUser != nil && host.RunUser.Home != "" {
			opts = append(opts, isolation.RunUserHome(host.RunUser.Home))
		}
		p.Policy = isolation.HostPolicy(hostAccess, p.Workspace, p.Protected, opts...)
		p.Network = isolation.Network{Allowed: fa.AllowNetwork, Mode: "none"}
		if fa.AllowNetwork {
			p.Network.Mode = "host"
			c.why["network"] = "DIRECT and unfiltered (file_access.allow_network = true, an admin's opt-in, logged on every run): the agent and its tools reach any host, and provider keys travel on stdin"
		} else {
			c.why["network"] = "none — an empty network namespace and Landlock TCP deny (file_access.allow_network = false); the only way out is the run's egress socket"
		}
		c.why["policy"] = "the workspace read-write, the system set read-only (/usr, /bin, /lib*, a few /etc files; never /etc/shadow), file_access paths, and berth's config, state and other agents' workspaces denied"
		if host.Systemd {
			c.why["limits"] = memoryWhy + ": cgroup limits of a transient unit"
		} else {
			c.why["limits"] = memoryWhy + ": systemd is not reachable, so a cgroup of the run's own where one is writable; else per-process rlimits when [scheduler] allow_rlimit_fallback = true, or the run fails closed"
		}
	}

	providers(&c, cfg, a, host)
	egressPlan(&c, cfg, a, host)
	agentToolsWhy(&c, a)
	ov.explain(&c)
	return c, nil
}

// AgentUserFor is the run user of an agent whose uid (and gid, the same
// number) berth allocated from [scheduler] agent_uids. No passwd entry
// names it: its Name is the bare number, it has no home (HOME is the
// workspace) and no supplementary group.
func AgentUserFor(uid uint32) *isolation.RunUser {
	return &isolation.RunUser{Name: strconv.FormatUint(uint64(uid), 10), UID: uid, GID: uid, Groups: []uint32{uid}}
}

// userWhy says who the agent runs as and why.
func userWhy(cfg *config.Config, host HostFacts) string {
	u := host.RunUser
	switch {
	case u != nil && host.AgentUser:
		return fmt.Sprintf("uid %d, gid %d, allocated from [scheduler] agent_uids (%s) for this agent only: file permissions keep other agents out of its workspace and per-user limits (RLIMIT_NPROC) count its processes alone; the uid has no passwd entry (tools see a bare number, HOME is the workspace) and is never given to another agent", u.UID, u.GID, cfg.Scheduler.AgentUIDs)
	case u != nil:
		why := fmt.Sprintf("%s (uid %d, gid %d): [scheduler] run_as; never root", u.Name, u.UID, u.GID)
		if cfg.Scheduler.AgentUIDs.Off {
			why += "; [scheduler] agent_uids = \"off\": every agent runs as this one user, so only Landlock separates agents and they share per-user limits"
		}
		return why
	case host.RunUserErr != nil && host.AgentUser:
		return fmt.Sprintf("the agent's own uid from [scheduler] agent_uids (%s), which cannot be had: %v", cfg.Scheduler.AgentUIDs, host.RunUserErr)
	case host.RunUserErr != nil:
		return fmt.Sprintf("%s: [scheduler] run_as (cannot look it up: %v)", cfg.Scheduler.RunAs, host.RunUserErr)
	}
	return fmt.Sprintf("the scheduler's own user: it is not root, so it cannot switch to [scheduler] run_as (%s) or to a uid of its own per agent ([scheduler] agent_uids)", cfg.Scheduler.RunAs)
}

// containerPlan fills in what a container run gets. Its settings were
// checked when the config was loaded, and the container backend checks the
// plan again before the engine sees it; a third check here would be a
// third spelling of the rules.
func containerPlan(c *compiled, a config.Agent) {
	p := &c.plan
	cm := a.Container
	p.SandboxWorkspace = isolation.ContainerWorkspace
	p.Network = isolation.Network{Allowed: cm.Network != "none", Mode: cm.Network}
	p.Policy = isolation.ContainerPolicy(p.Network.Allowed)
	p.Mounts = []isolation.Mount{{Source: p.Workspace, Target: isolation.ContainerWorkspace}}
	for _, b := range cm.Binds {
		// SRC:DST[:ro|rw]; cut, not indexed: a malformed bind in a Config
		// made in code reaches the backend's check instead of panicking.
		src, rest, _ := strings.Cut(b, ":")
		dst, mode, _ := strings.Cut(rest, ":")
		p.Mounts = append(p.Mounts, isolation.Mount{Source: src, Target: dst, ReadOnly: mode == "ro"})
	}
	p.Container = isolation.ContainerPlan{Image: cm.Image, Runtime: cm.Runtime, SecurityOpt: cm.SecurityOpt, Warm: cm.Warm}
	if cm.Network == "none" {
		c.why["network"] = "none — no interface but loopback; Landlock denies TCP as well (container_mode.network); the only way out is the run's egress socket"
	} else {
		c.why["network"] = fmt.Sprintf("%s — DIRECT and unfiltered through the engine's bridge (container_mode.network, an admin's opt-in, logged on every run); no published ports; provider keys travel on stdin", cm.Network)
	}
	if cm.Image != "" {
		c.why["image"] = fmt.Sprintf("%s (container_mode.image; must be in the engine, no registry is used)", cm.Image)
	} else {
		c.why["image"] = "berth-agent:<content hash> built locally from [scheduler] agent_binary and busybox-static (FROM scratch)"
	}
	if cm.Runtime != "" {
		c.why["runtime"] = cm.Runtime + " (container_mode.runtime)"
	} else {
		c.why["runtime"] = "the engine's default (container_mode.runtime unset)"
	}
	c.why["mounts"] = "the workspace at /workspace (rw, HOME, working directory), then container_mode.binds; read-only rootfs, no capabilities, no-new-privileges"
	c.why["policy"] = "inside the container berth-agent confines itself with Landlock: /workspace and /tmp read-write, the system set read-only"
	if cm.Warm > 0 {
		c.why["warm"] = fmt.Sprintf("%d started container(s) kept waiting on stdin (container_mode.warm); a message takes one, which is removed after it", cm.Warm)
	} else {
		c.why["warm"] = "none (container_mode.warm = 0): each message creates and starts its container"
	}
}

// providers fills in the provider chain and what keeps it from working.
func providers(c *compiled, cfg *config.Config, a config.Agent, host HostFacts) {
	getenv := host.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	chain, err := cfg.ProviderChain(a, getenv)
	if err != nil {
		c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Err: err})
		// Show the chain anyway, without keys.
		chain, err = cfg.ProviderChain(a, func(string) string { return "unset" })
		if err != nil {
			c.why["providers"] = err.Error()
			return
		}
		for i := range chain {
			chain[i].Key = ""
		}
	}
	c.plan.Providers = chain
	if len(chain) == 0 {
		c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "agent %s has no provider", a.ID))
		return
	}
	var names []string
	for _, pr := range chain {
		names = append(names, pr.Name+" ("+pr.Kind+")")
	}
	c.why["providers"] = strings.Join(names, ", then ") + ": the agent's provider, then [providers] fallback; keys are read from api_key_env in the scheduler's environment"
}

// Default endpoints of the provider kinds, where the proxy sends a provider
// without base_url.
var defaultEndpoints = map[string]string{
	"openai":    "https://api.openai.com/v1",
	"anthropic": "https://api.anthropic.com",
}

// egressPlan gives a run without a network of its own its way out: the
// run's socket, its allow rules and its providers' endpoints. A run with a
// direct network (an admin's opt-in) or with nothing to reach gets none.
// maxSocketPath is what sun_path holds besides its terminating NUL;
// runIDLength is the length of the scheduler's run ids
// (20261201T113402_018006016_6bcbbdf01b) with room for an attempt ("-99").
const (
	maxSocketPath = 107
	runIDLength   = 36 + 3
)

func egressPlan(c *compiled, cfg *config.Config, a config.Agent, host HostFacts) {
	p := &c.plan
	if p.Network.Allowed || p.Backend == isolation.BackendUnrestricted {
		if p.Backend == isolation.BackendUnrestricted {
			c.why["egress"] = "none: an unrestricted run uses the host's network directly"
		} else {
			c.why["egress"] = "none: the run has a direct network (see network); provider keys travel on stdin"
		}
		c.why["egress"] += toolAskWhy(a, nil)
		return
	}
	var endpoints []isolation.EgressProvider
	for _, pr := range p.Providers {
		if pr.Kind == "local" {
			continue
		}
		base := pr.BaseURL
		if base == "" {
			base = defaultEndpoints[pr.Kind]
		}
		// What the proxy may add to the call comes from the admin's
		// [providers.X], never from the sandbox.
		conf := cfg.Providers.Entries[pr.Name]
		endpoints = append(endpoints, isolation.EgressProvider{Name: pr.Name, Kind: pr.Kind, BaseURL: base, Model: pr.Model,
			Endpoints: conf.Endpoints, APIVersion: conf.APIVersion, Organization: conf.Organization, Project: conf.Project,
			Prices: conf.ModelPrices()})
	}
	var rules []isolation.EgressRule
	for _, s := range a.EgressAllow {
		r, err := isolation.ParseEgressRule(s)
		if err != nil {
			c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "agent %q: egress.allow: %v", a.ID, err))
			continue
		}
		rules = append(rules, r)
	}
	rules = append(rules, agentToolRules(c, a)...)
	var ask []isolation.EgressRule
	for _, s := range a.EgressAsk {
		r, err := isolation.ParseEgressRule(s)
		if err != nil {
			c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "agent %q: egress.ask: %v", a.ID, err))
			continue
		}
		ask = append(ask, r)
	}
	toolAsk := toolAskRules(c, a)
	// A secret's host an ask rule names gets the secret too: the proxy adds
	// it to a request only once a person allowed it.
	secrets := egressSecrets(c, cfg, a, slices.Concat(rules, askReach(ask)), host)
	git := gitPlan(c, cfg, a, host)
	secrets = git.withSecrets(c, cfg, secrets, host)
	if len(endpoints) == 0 && len(rules) == 0 && len(git.rules) == 0 && len(ask) == 0 && len(toolAsk) == 0 {
		c.why["egress"] = "none: the agent calls no remote provider and [agents.egress] allow is empty, so nothing leaves the sandbox"
		return
	}
	dir := host.EgressDir
	if dir == "" {
		dir = filepath.Join(host.StateDir, "egress")
	}
	runDir := filepath.Join(dir, isolation.AttemptName(p.RunID, p.Attempt))
	if p.RunID == "" {
		runDir = filepath.Join(dir, "<run id>")
	}
	e := &isolation.EgressPlan{
		Socket:    filepath.Join(runDir, isolation.EgressSocketName),
		ProxyAddr: fmt.Sprintf("127.0.0.1:%d", isolation.EgressProxyPort),
		Allow:     rules,
		Ask:       ask,
		ToolAsk:   toolAsk,
		Providers: endpoints,
		Proxy:     isolation.EgressProxyProcess{Binary: cfg.Scheduler.EgressBinary},
		Agent:     a.ID,
		ReadOnly:  a.EgressReadOnly,
	}
	if len(ask) > 0 || len(toolAsk) > 0 {
		e.ApprovalTimeout = a.EgressApprovalTimeout
	}
	e.SandboxSocket = e.Socket
	git.apply(e)
	// The proxy intercepts the secrets' hosts and the git rules' with the run's CA.
	// A read-only run's every tunnel is read, so it needs the CA too.
	// Inside ask rules ("POST api.stripe.com") are judged in the tunnel too.
	if len(secrets) > 0 || len(git.rules) > 0 || (e.ReadOnly && len(rules)+len(ask) > 0) || len(egresspolicy.InsideAskRules(ask)) > 0 {
		e.Secrets = secrets
		e.CABundle = filepath.Join(runDir, isolation.EgressCABundleName)
		e.SandboxCABundle = e.CABundle
		if p.Backend != isolation.BackendContainer && p.Backend != isolation.BackendKubernetes {
			// Tools read the bundle where it is: under the protected state dir.
			p.Policy = isolation.KeepReadable(p.Policy, runDir)
		}
	}
	if p.Backend == isolation.BackendContainer {
		e.SandboxSocket = filepath.Join(isolation.SandboxEgressDir, isolation.EgressSocketName)
		if e.CABundle != "" {
			e.SandboxCABundle = filepath.Join(isolation.SandboxEgressDir, isolation.EgressCABundleName)
			// berth-agent's Landlock inside the container reads only what
			// its policy names: without this, every TLS client fails.
			p.Policy.AllowRead = append(p.Policy.AllowRead, e.SandboxCABundle)
		}
		// Read-only: connecting to the socket needs no write to the mount,
		// and a tool must not write into the scheduler's state directory.
		p.Mounts = append(p.Mounts, isolation.Mount{Source: runDir, Target: isolation.SandboxEgressDir, ReadOnly: true})
	}
	if p.Backend == isolation.BackendKubernetes {
		kubeEgress(c, cfg, e) // kube.go
	}
	if host.EgressUser != nil {
		e.Proxy.User = host.EgressUser.Name
		if host.RunUser != nil && host.EgressUser.UID == host.RunUser.UID {
			c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart,
				"[scheduler] egress_user %q is the run user: the proxy holds the provider keys and must be another user", host.EgressUser.Name))
		}
	}
	// The agent and its tools may connect to the in-sandbox proxy only.
	p.Policy.ConnectPorts = append(slices.Clone(p.Policy.ConnectPorts), isolation.EgressProxyPort)
	p.Egress = e
	var names []string
	for _, ep := range endpoints {
		names = append(names, fmt.Sprintf("%s at %s with model %q", ep.Name, ep.BaseURL, ep.Model))
	}
	why := fmt.Sprintf("through the run's socket %s: berth-agent serves it on %s for its provider calls and its tools (HTTP_PROXY/HTTPS_PROXY); the egress proxy checks the run's token, adds the provider key on the way out (the sandbox holds none) and records each decision", e.Socket, e.ProxyAddr)
	if len(names) > 0 {
		why += "; providers: " + strings.Join(names, ", ")
	}
	if len(a.EgressAllow) > 0 {
		var raw []string
		for _, r := range rules {
			if r.AgentTool == "" {
				raw = append(raw, r.Raw)
			}
		}
		why += "; [agents.egress] allow: " + strings.Join(raw, ", ") + " (loopback, private and link-local destinations only when a rule names the host)"
	} else {
		why += "; [agents.egress] allow is empty: nothing else passes"
	}
	if len(ask) > 0 {
		var raw []string
		for _, r := range ask {
			raw = append(raw, r.Raw)
		}
		why += fmt.Sprintf("; [agents.egress] ask: %s (a request no allow rule allows but one of these matches waits until a person answers in the conversation or with berthctl approvals, refused after %s)",
			strings.Join(raw, ", "), e.ApprovalTimeout)
	}
	for _, s := range secrets {
		why += fmt.Sprintf("; secret %s is added as %s for %s (TLS intercepted with the run's own CA, which the sandbox trusts through %s; other hosts are never intercepted)",
			s.Name, s.Header, strings.Join(s.Hosts, ", "), e.SandboxCABundle)
		if len(s.Ports) > 0 || len(s.Methods) > 0 || len(s.Paths) > 0 {
			why += fmt.Sprintf(", only on ports %v, for methods %v, under paths %v (empty: any); other requests to its hosts are sent without it", s.Ports, s.Methods, s.Paths)
		}
	}
	c.why["egress"] = why + toolAskWhy(a, e) + agentChannelWhy(rules, secrets) + git.why(e)
	if host.EgressUnavailable != nil {
		if len(endpoints) > 0 {
			c.problems = append(c.problems, providerNeedsNetwork(a, *p, endpoints[0], host.EgressUnavailable))
		} else {
			c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "the egress proxy is not available", Err: host.EgressUnavailable})
		}
		return
	}
	// A Unix socket address holds 107 bytes and a NUL; a longer path would
	// only fail at bind time with "invalid argument".
	longest := e.Socket
	if p.RunID == "" {
		longest = filepath.Join(dir, strings.Repeat("x", runIDLength), isolation.EgressSocketName)
	}
	if len(longest) > maxSocketPath {
		c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart,
			"the egress socket path %s is %d bytes, over the %d a Unix socket address holds; use a shorter state directory", longest, len(longest), maxSocketPath))
	}
}

// egressSecrets are the [[egress.secrets]] that apply to a run: those whose
// hosts the agent's allow rules let it reach (CONNECT to 443). A value that
// cannot be read is a problem: the run would fail at that host.
func egressSecrets(c *compiled, cfg *config.Config, a config.Agent, rules []isolation.EgressRule, host HostFacts) []isolation.EgressSecret {
	getenv := host.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var out []isolation.EgressSecret
	owners := agentSecretOwners(a)
	for _, s := range cfg.EgressSecrets {
		var hosts []string
		for _, h := range s.Hosts {
			if reachable(channelRules(rules, owners[s.Name]), h, s.Ports) {
				hosts = append(hosts, h)
			}
		}
		if len(hosts) == 0 {
			continue
		}
		value, err := secretValue(s, getenv)
		if err != nil {
			c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("egress secret %s", s.Name), Err: err})
			continue
		}
		out = append(out, isolation.EgressSecret{Name: s.Name, Hosts: hosts, Header: s.Header, Format: s.Format,
			Ports: s.Ports, Methods: upper(s.Methods), Paths: s.Paths, Value: value, AgentTool: owners[s.Name]})
	}
	return out
}

// reachable says whether a rule lets CONNECT reach host on its port (443
// for a rule without one), and on one of ports when the secret names them.
func reachable(rules []isolation.EgressRule, host string, ports []int) bool {
	for _, r := range rules {
		port := r.Port
		if port == 0 {
			port = 443
		}
		if r.Matches("CONNECT", host, port) && (len(ports) == 0 || slices.Contains(ports, port)) {
			return true
		}
	}
	return false
}

func upper(ss []string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, strings.ToUpper(s))
	}
	return out
}

// secretValue reads a secret from the scheduler's environment or its file
// (relative paths are under $CREDENTIALS_DIRECTORY).
func secretValue(s config.EgressSecret, getenv func(string) string) (string, error) {
	if s.Env != "" {
		v := getenv(s.Env)
		if v == "" {
			return "", fmt.Errorf("%s is not set in the scheduler's environment", s.Env)
		}
		return v, nil
	}
	path := s.File
	if !filepath.IsAbs(path) {
		dir := getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", fmt.Errorf("file %q is relative and $CREDENTIALS_DIRECTORY is not set", s.File)
		}
		path = filepath.Join(dir, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", path, err)
	}
	v := strings.TrimSpace(string(data))
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

// providerNeedsNetwork fails closed, before anything starts, a run whose
// provider is reached over the network when the sandbox has none and no
// egress proxy can serve it: the run would otherwise spend its retries on
// connection errors.
func providerNeedsNetwork(a config.Agent, p isolation.Plan, pr isolation.EgressProvider, why error) *isolation.RunError {
	setting := fmt.Sprintf("set file_access.allow_network = true for agent %q", a.ID)
	if p.Backend == isolation.BackendContainer {
		setting = fmt.Sprintf("set container_mode.network = \"bridge\" for agent %q", a.ID)
	}
	return isolation.Errorf(isolation.ReasonProviderNeedsNetwork,
		"agent %q uses provider %q (%s), which is reached over the network, but the agent has no network access and the egress proxy cannot serve it (%v): install berth-egress and its user ([scheduler] egress_binary, egress_user), or %s (a direct, unfiltered network), or use provider \"local\"",
		a.ID, pr.Name, pr.Kind, why, setting)
}

// WorkspaceOf is the agent's configured workspace or <state>/agents/<id>.
func WorkspaceOf(a config.Agent, stateDir string) string {
	if a.Workspace != "" {
		return filepath.Clean(a.Workspace)
	}
	return filepath.Join(stateDir, "agents", a.ID)
}

// ProtectedPaths are what an agent must never reach even when its
// file_access allows a parent: the state dir (and intake's beside it), the
// config dir, connector secret and credential files, egress secret files and
// the other agents' workspaces.
// isolation.HostPolicy keeps the agent's own workspace reachable when one of
// them contains it.
func ProtectedPaths(cfg *config.Config, a config.Agent, host HostFacts) []string {
	workspace := WorkspaceOf(a, host.StateDir)
	protect := []string{host.StateDir, filepath.Join(filepath.Dir(host.StateDir), "intake")}
	add := func(p string) {
		if p != "" && !slices.Contains(protect, p) {
			protect = append(protect, p)
		}
	}
	for _, c := range cfg.Connectors {
		add(c.SecretFile)
		// Credentials written as absolute paths are files holding secrets.
		for _, ref := range []string{c.Token, c.AppToken, c.BotToken, c.SigningSecret} {
			if filepath.IsAbs(ref) {
				add(filepath.Clean(ref))
			}
		}
	}
	for _, s := range cfg.EgressSecrets {
		if filepath.IsAbs(s.File) {
			add(filepath.Clean(s.File))
		}
	}
	for _, app := range cfg.GitHubApps {
		if filepath.IsAbs(app.PrivateKey) {
			add(filepath.Clean(app.PrivateKey))
		}
	}
	if host.ConfigDir != "" {
		add(host.ConfigDir)
	} else {
		for _, src := range cfg.Sources {
			add(filepath.Dir(src))
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
		if ws := WorkspaceOf(oa, host.StateDir); ws != workspace {
			add(ws)
		}
	}
	return protect
}

// BackendOf is the backend an agent's runs use, as Compile chooses it (the
// one place it is chosen), for callers that need no whole plan (warm pools).
func BackendOf(a config.Agent, forceUnrestricted bool) isolation.BackendKind {
	switch {
	case a.Isolation == string(isolation.BackendKubernetes):
		return isolation.BackendKubernetes
	case a.Isolation == string(isolation.BackendContainer):
		return isolation.BackendContainer
	case a.Isolation == string(isolation.BackendUnrestricted) || forceUnrestricted:
		return isolation.BackendUnrestricted
	}
	return isolation.BackendLandlock
}

// askReach are the ask rules as the hosts they reach: an inside ask rule
// ("POST api.stripe.com") reaches its host through the tunnel the proxy
// opens for it, whatever the method.
func askReach(ask []isolation.EgressRule) []isolation.EgressRule {
	out := make([]isolation.EgressRule, 0, len(ask))
	for _, r := range ask {
		if len(egresspolicy.InsideAskRules([]isolation.EgressRule{r})) > 0 {
			r.Methods = nil
		}
		out = append(out, r)
	}
	return out
}
