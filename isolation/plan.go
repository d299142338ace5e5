package isolation

import (
	"encoding/json"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// BackendKind names the backend a plan is for; it is also the backend's
// config name and the key of the scheduler's backend map.
type BackendKind string

// The backends.
const (
	BackendLandlock     BackendKind = "landlock"
	BackendUnrestricted BackendKind = "unrestricted"
	BackendContainer    BackendKind = "container"
	// BackendKubernetes runs each request in a pod of a Kubernetes
	// cluster (isolation/kube; ADR 22).
	BackendKubernetes BackendKind = "kubernetes"
)

// Where a container agent finds its workspace and scratch space.
const (
	ContainerWorkspace = "/workspace"
	ContainerTmp       = "/tmp"
)

// Plan is everything one run's sandbox is made of, decided once (by
// internal/runplan) before the run starts. It holds no config types; a backend
// reads it and never changes it. `berthctl sandbox explain` shows this very
// value, without the provider keys.
type Plan struct {
	Backend BackendKind `json:"backend"`
	RunID   string      `json:"run_id,omitempty"`
	// Attempt is the number of the run's start this plan is for (1, 2, …;
	// 0 for a plan of no start, such as sandbox explain). With RunID it
	// names what the sandbox leaves on the host (AttemptName).
	Attempt int    `json:"attempt,omitempty"`
	AgentID string `json:"agent"`
	// AgentBinary is the host path of berth-agent.
	AgentBinary string `json:"agent_binary"`
	// RunAs is the name of the unprivileged user the agent runs as; User is
	// that user looked up on this host (nil when it was not looked up: the
	// scheduler is not root and runs agents as itself).
	RunAs string   `json:"run_as"`
	User  *RunUser `json:"user,omitempty"`
	// Workspace is the host path of the agent's workspace (it exists);
	// SandboxWorkspace is the same directory as the agent sees it.
	Workspace        string `json:"workspace"`
	SandboxWorkspace string `json:"sandbox_workspace"`
	// Policy is the Landlock policy berth-agent applies to itself.
	Policy agentproto.Policy `json:"policy"`
	// Protected are the paths denied whatever file_access says (berth's
	// config and state, other agents' workspaces, secret files); they are
	// part of Policy.Deny for host runs.
	Protected []string `json:"protected,omitempty"`
	Limits    Limits   `json:"limits"`
	Network   Network  `json:"network"`
	// Mounts are the container's binds, the workspace first.
	Mounts    []Mount       `json:"mounts,omitempty"`
	Container ContainerPlan `json:"container,omitzero"`
	// Kube is what only the kubernetes backend reads (kubeplan.go).
	Kube KubePlan `json:"kubernetes,omitzero"`
	// Providers is the provider chain, keys included. With Egress the keys
	// stay with the egress proxy and the request carries none; without it
	// (a direct network the admin opted into) they travel only on stdin.
	Providers []agentproto.Provider `json:"providers"`
	// Egress is the run's way out through berth's egress proxy; nil when the
	// run needs none (local provider, no rules) or has a direct network.
	Egress *EgressPlan `json:"egress,omitempty"`
	// Timeout ends the run; KillGrace bounds how long the agent's output is
	// drained once it ended.
	Timeout   time.Duration `json:"timeout"`
	KillGrace time.Duration `json:"kill_grace"`
}

// RequireLimits refuses a plan without a memory, process or CPU limit, as
// every backend does before it starts anything: config and runplan default
// each limit once, and to an engine or a cgroup a zero means no limit at
// all, so a plan that lost one would run unbounded (fail closed instead).
func (p Plan) RequireLimits() error {
	var missing string
	switch {
	case p.Limits.MemoryBytes <= 0:
		missing = "memory limit"
	case p.Limits.Pids <= 0:
		missing = "process limit"
	case p.Limits.NanoCPUs <= 0:
		missing = "CPU limit"
	default:
		return nil
	}
	return Errorf(ReasonStart, "cannot run the plan of run %s (agent %s): it has no %s", p.RunID, p.AgentID, missing)
}

// AttemptName names what one attempt of a run leaves on the host: its
// container, transient unit, cgroup and egress directory. A run started again
// after a crash keeps its id, so only the attempt tells a dead start's
// leftovers from the live one's. Attempt 0 is the run id alone.
func AttemptName(runID string, attempt int) string {
	if attempt <= 0 {
		return runID
	}
	return runID + "-" + strconv.Itoa(attempt)
}

// ParseAttemptName splits an AttemptName; a name without a valid attempt
// is (name, 0).
func ParseAttemptName(name string) (runID string, attempt int) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name, 0
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n <= 0 || strconv.Itoa(n) != name[i+1:] { // AttemptName's spelling only
		return name, 0
	}
	return name[:i], n
}

// RunUser is a looked-up run user.
type RunUser struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	Home   string   `json:"home,omitempty"`
}

// Limits are a run's resource limits.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes"`
	Pids        int64 `json:"pids"`
	NanoCPUs    int64 `json:"nano_cpus"` // 1e9 is one CPU
	TmpfsBytes  int64 `json:"tmpfs_bytes,omitempty"`
	// RlimitFallback: a host run that neither systemd nor a writable cgroup
	// can limit as a whole may run with per-process rlimits instead of
	// failing ([scheduler] allow_rlimit_fallback, an admin's choice).
	RlimitFallback bool `json:"rlimit_fallback,omitempty"`
	// WorkspaceBytes is the workspace's enforced size limit
	// (workspace_quota); 0 means none.
	WorkspaceBytes int64 `json:"workspace_bytes"`
}

// Network is what the sandbox can reach.
type Network struct {
	// Allowed says whether the agent may open TCP connections at all.
	Allowed bool `json:"allowed"`
	// Mode is "none" (an empty network namespace), "host" (a host run with
	// allow_network) or "bridge" (a container on the engine's bridge).
	Mode string `json:"mode"`
}

// Mount is one bind mount of a container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// ContainerPlan is what only the container backend reads.
type ContainerPlan struct {
	// Image is the image reference; "" means the berth-agent image built
	// from AgentBinary.
	Image       string   `json:"image,omitempty"`
	Runtime     string   `json:"runtime,omitempty"`
	SecurityOpt []string `json:"security_opt,omitempty"`
	// Warm is how many started containers wait for this agent's requests.
	Warm int `json:"warm,omitempty"`
}

// Redacted is the plan without any secret: what may be shown, logged or
// sent over D-Bus.
func (p Plan) Redacted() Plan {
	providers := make([]agentproto.Provider, len(p.Providers))
	for i, pr := range p.Providers {
		pr.Key = ""
		providers[i] = pr
	}
	p.Providers = providers
	if p.Egress != nil && len(p.Egress.Secrets) > 0 {
		e := *p.Egress
		e.Secrets = make([]EgressSecret, len(p.Egress.Secrets))
		for i, s := range p.Egress.Secrets {
			s.Value = ""
			e.Secrets[i] = s
		}
		p.Egress = &e
	}
	if p.Egress != nil && len(p.Egress.GitHubApps) > 0 {
		e := *p.Egress
		e.GitHubApps = make([]egresspolicy.GitHubApp, len(p.Egress.GitHubApps))
		for i, a := range p.Egress.GitHubApps {
			a.PrivateKey = ""
			e.GitHubApps[i] = a
		}
		p.Egress = &e
	}
	return p
}

// LookupRunUser looks up a run user by name (or numeric id).
func LookupRunUser(name string) (*RunUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, perr := strconv.ParseUint(name, 10, 32); perr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cannot find run user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("run user %q has no numeric ids", name)
	}
	ru := &RunUser{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				ru.Groups = append(ru.Groups, uint32(g))
			}
		}
	}
	if len(ru.Groups) == 0 {
		ru.Groups = []uint32{ru.GID}
	}
	return ru, nil
}

// Spec is one run handed to a backend: its plan, the request for the agent's
// stdin and the callback that records the sandbox's handle.
type Spec struct {
	Plan
	// Request is written to the agent's stdin. It carries the provider key:
	// backends must never put any of it in argv, environment, labels or files.
	// Its policy and workspace are the plan's (Input makes sure of it).
	Request agentproto.Request
	// OnStart is called once the sandbox exists, with a handle Kill
	// understands. The scheduler persists it so a restarted scheduler can
	// kill orphans; when it cannot (an error), the run is ended at once
	// rather than left unkillable. May be nil.
	OnStart func(handle string) error
	// EgressToken is the run's token at its egress proxy (with Plan.Egress):
	// a secret, like the keys, that travels only on stdin.
	EgressToken string
	// EgressAgentToken opens berth-agent's own channel at the proxy
	// (docs/adr/0026-agent-own-egress-channel.md); on stdin only, like EgressToken.
	EgressAgentToken string
	// Files are the run's files for a backend whose workspace is not on
	// the scheduler's host (RunFiles); nil for the others.
	Files *RunFiles
}

// throughEgress is a provider as an agent behind the egress proxy calls it:
// no key, its base URL the in-sandbox proxy.
func throughEgress(pr agentproto.Provider, e *EgressPlan) agentproto.Provider {
	pr.Key = ""
	if pr.Kind != "local" {
		pr.Proxied, pr.Endpoint = true, pr.BaseURL
		pr.BaseURL = ProviderProxyURL(e.ProxyAddr, pr.Name)
	}
	return pr
}

// Input is the request as the agent reads it on stdin: the plan's run id,
// policy, workspace and providers, and the rest of Request.
func (s Spec) Input() ([]byte, error) {
	req := s.Request
	if req.RunID == "" {
		req.RunID = s.RunID
	}
	if req.RunID != s.RunID {
		return nil, Errorf(ReasonStart, "request run id %q does not match run %q", req.RunID, s.RunID)
	}
	req.Policy = s.Policy
	if s.SandboxWorkspace != "" {
		req.Workspace = s.SandboxWorkspace
	} else if req.Workspace == "" {
		req.Workspace = s.Workspace
	}
	if len(s.Providers) > 0 && req.Provider == (agentproto.Provider{}) {
		req.Provider, req.Fallback = s.Providers[0], s.Providers[1:]
	}
	if s.Egress != nil {
		// The proxy holds the keys: the agent calls its providers through it.
		req.Provider = throughEgress(req.Provider, s.Egress)
		fallback := make([]agentproto.Provider, len(req.Fallback))
		for i, pr := range req.Fallback {
			fallback[i] = throughEgress(pr, s.Egress)
		}
		req.Fallback = fallback
		req.Egress = &agentproto.Egress{ProxyAddr: s.Egress.ProxyAddr, Socket: s.Egress.SandboxSocket, Token: s.EgressToken, CABundle: s.Egress.SandboxCABundle, AgentToken: s.EgressAgentToken}
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, &RunError{Reason: ReasonStart, Detail: "cannot encode request", Err: err}
	}
	return data, nil
}
