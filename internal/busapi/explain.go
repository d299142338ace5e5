package busapi

import (
	"encoding/json"
	"fmt"
	"time"
)

// Backend names, as a Plan and a Run name them.
const (
	BackendLandlock     = "landlock"
	BackendContainer    = "container"
	BackendUnrestricted = "unrestricted"
)

// Explanation is dev.berth.Scheduler1.ExplainAgent's answer: the plan the
// agent's next run would get with the scheduler's current config, why,
// what would refuse it, and how the backend confines it on this host. Its
// wire form is a JSON string (plan_json in the XML).
type Explanation struct {
	Plan Plan `json:"plan"`
	// Why maps a decision ("backend", "limits", "network", ...) to why.
	Why map[string]string `json:"why"`
	// Problems would fail the run before it starts (a missing key, a
	// provider that needs a network the agent does not have).
	Problems []string `json:"problems,omitempty"`
	// BackendAvailable says the scheduler has the plan's backend.
	BackendAvailable bool         `json:"backend_available"`
	Confinement      *Confinement `json:"confinement,omitempty"`
}

// Plan is a run's plan as the bus shows it: the scheduler's plan without a
// field that could hold a secret (no provider key, no secret's value), so
// none can cross the bus.
type Plan struct {
	Backend          string        `json:"backend"`
	RunID            string        `json:"run_id,omitempty"`
	Attempt          int           `json:"attempt,omitempty"`
	AgentID          string        `json:"agent"`
	AgentBinary      string        `json:"agent_binary"`
	RunAs            string        `json:"run_as"`
	User             *RunUser      `json:"user,omitempty"`
	Workspace        string        `json:"workspace"`
	SandboxWorkspace string        `json:"sandbox_workspace"`
	Policy           Policy        `json:"policy"`
	Protected        []string      `json:"protected,omitempty"`
	Limits           Limits        `json:"limits"`
	Network          Network       `json:"network"`
	Mounts           []Mount       `json:"mounts,omitempty"`
	Container        ContainerPlan `json:"container,omitzero"`
	Kube             KubePlan      `json:"kubernetes,omitzero"`
	Providers        []Provider    `json:"providers"`
	Egress           *EgressPlan   `json:"egress,omitempty"`
	Timeout          time.Duration `json:"timeout"`
	KillGrace        time.Duration `json:"kill_grace"`
}

// RunUser is the user a run's agent runs as, looked up on the host.
type RunUser struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	Home   string   `json:"home,omitempty"`
}

// Policy is the Landlock policy berth-agent applies to itself.
type Policy struct {
	Unrestricted   bool     `json:"unrestricted,omitempty"`
	AllowRead      []string `json:"allow_read,omitempty"`
	AllowReadWrite []string `json:"allow_read_write,omitempty"`
	Deny           []string `json:"deny,omitempty"`
	Network        bool     `json:"network"`
	ConnectPorts   []uint16 `json:"connect_ports,omitempty"`
}

// Limits are a run's resource limits.
type Limits struct {
	MemoryBytes    int64 `json:"memory_bytes"`
	Pids           int64 `json:"pids"`
	NanoCPUs       int64 `json:"nano_cpus"` // 1e9 is one CPU
	TmpfsBytes     int64 `json:"tmpfs_bytes,omitempty"`
	RlimitFallback bool  `json:"rlimit_fallback,omitempty"`
	WorkspaceBytes int64 `json:"workspace_bytes"`
}

// Network is what the sandbox can reach: Mode "none" (only the run's egress
// socket), "host" or "bridge" (direct and unfiltered, Allowed).
type Network struct {
	Allowed bool   `json:"allowed"`
	Mode    string `json:"mode"`
}

// Mount is one bind mount of a container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// ContainerPlan is what only the container backend reads.
type ContainerPlan struct {
	Image       string   `json:"image,omitempty"`
	Runtime     string   `json:"runtime,omitempty"`
	SecurityOpt []string `json:"security_opt,omitempty"`
	Warm        int      `json:"warm,omitempty"`
}

// KubePlan is what only the kubernetes backend reads (ADR 22).
type KubePlan struct {
	Namespace        string            `json:"namespace,omitempty"`
	Image            string            `json:"image,omitempty"`
	ImagePullPolicy  string            `json:"image_pull_policy,omitempty"`
	RuntimeClass     string            `json:"runtime_class,omitempty"`
	NodeSelector     map[string]string `json:"node_selector,omitempty"`
	Tolerations      []KubeToleration  `json:"tolerations,omitempty"`
	ServiceAccount   string            `json:"service_account,omitempty"`
	ProxyAddr        string            `json:"proxy_addr,omitempty"`
	EgressVerifiedBy string            `json:"egress_verified_by,omitempty"`
	Warm             int               `json:"warm,omitempty"`
	// Workspace is "pvc" when /workspace is the agent's claim (ADR 29).
	Workspace     string `json:"workspace,omitempty"`
	StorageClass  string `json:"storage_class,omitempty"`
	WorkspaceSize int64  `json:"workspace_size,omitempty"`
	AccessMode    string `json:"access_mode,omitempty"`
}

// KubeToleration is one toleration of a run's pod.
type KubeToleration struct {
	Key      string `json:"key,omitempty"`
	Operator string `json:"operator,omitempty"`
	Value    string `json:"value,omitempty"`
	Effect   string `json:"effect,omitempty"`
}

// Price is a model's price per million tokens ([providers.X.prices]).
type Price struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
	Cached float64 `json:"cached,omitempty"`
}

// Provider is one provider of the plan's chain, without its key.
type Provider struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	BaseURL   string `json:"base_url,omitempty"`
	Model     string `json:"model,omitempty"`
	MaxTokens int    `json:"max_tokens,omitempty"`
	Proxied   bool   `json:"proxied,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
}

// EgressPlan is the run's way out through berth's egress proxy.
type EgressPlan struct {
	Socket          string             `json:"socket"`
	SandboxSocket   string             `json:"sandbox_socket"`
	ProxyAddr       string             `json:"proxy_addr"`
	Allow           []EgressRule       `json:"allow,omitempty"`
	Providers       []EgressProvider   `json:"providers,omitempty"`
	Proxy           EgressProxyProcess `json:"proxy"`
	Secrets         []EgressSecret     `json:"secrets,omitempty"`
	CABundle        string             `json:"ca_bundle,omitempty"`
	SandboxCABundle string             `json:"sandbox_ca_bundle,omitempty"`
	// ReadOnly: only GET and HEAD without a body pass ([agents.egress]
	// mode = "read-only").
	ReadOnly bool `json:"read_only,omitempty"`
	// Ask are the rules whose requests wait for a person's decision, at
	// most ApprovalTimeout ([agents.egress] ask, approval_timeout).
	Ask             []EgressRule  `json:"ask,omitempty"`
	ApprovalTimeout time.Duration `json:"approval_timeout,omitempty"`
	// ToolAsk are the [agents.tools] ask rules: tool calls berth-agent asks
	// the proxy about before it runs them.
	ToolAsk []ToolAskRule `json:"tool_ask,omitempty"`
	// Agent names the agent in git's reasons; Git are its git rules and
	// GitHubApps the apps they name, without their keys.
	Agent      string      `json:"agent,omitempty"`
	Git        []GitRule   `json:"git,omitempty"`
	GitHubApps []GitHubApp `json:"github_apps,omitempty"`
}

// GitRule is one [[agents.egress.git]] entry.
type GitRule struct {
	Remote     string   `json:"remote"`
	Fetch      bool     `json:"fetch,omitempty"`
	Push       []string `json:"push,omitempty"`
	Force      bool     `json:"force,omitempty"`
	Delete     bool     `json:"delete,omitempty"`
	Credential string   `json:"credential,omitempty"`
}

// GitHubApp is an [[egress.github_apps]] entry without its private key.
type GitHubApp struct {
	Name           string `json:"name"`
	AppID          int64  `json:"app_id"`
	InstallationID int64  `json:"installation_id"`
	APIBaseURL     string `json:"api_base_url,omitempty"`
}

// ToolAskRule is one [agents.tools] ask rule: a tool, and for shell a
// command glob ("" asks for every call).
type ToolAskRule struct {
	Raw     string `json:"raw"`
	Tool    string `json:"tool"`
	Pattern string `json:"pattern,omitempty"`
}

// EgressRule is one allow entry, as written (Raw) and as parsed.
type EgressRule struct {
	Raw     string   `json:"rule"`
	Host    string   `json:"host"`
	Port    int      `json:"port,omitempty"`
	Methods []string `json:"methods,omitempty"`
	// AgentTool, when set, is berth-agent's own tool the rule is for: no
	// tool's request matches it (ADR 26).
	AgentTool string `json:"agent_tool,omitempty"`
}

// EgressProvider is a provider the proxy adds the key for, without the key.
type EgressProvider struct {
	Name         string   `json:"name"`
	Kind         string   `json:"kind"`
	BaseURL      string   `json:"base_url"`
	Model        string   `json:"model"`
	Endpoints    []string `json:"endpoints,omitempty"`
	APIVersion   string   `json:"api_version,omitempty"`
	Organization string   `json:"organization,omitempty"`
	Project      string   `json:"project,omitempty"`
	// Prices are the provider's prices by model.
	Prices map[string]Price `json:"prices,omitempty"`
}

// EgressProxyProcess is how the run's proxy is started.
type EgressProxyProcess struct {
	Binary string `json:"binary"`
	User   string `json:"user,omitempty"`
}

// EgressSecret is where the proxy adds a secret, without its value.
type EgressSecret struct {
	Name    string   `json:"name"`
	Hosts   []string `json:"hosts"`
	Header  string   `json:"header"`
	Format  string   `json:"format"`
	Ports   []int    `json:"ports,omitempty"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
	// AgentTool, when set, is berth-agent's own tool the secret is for.
	AgentTool string `json:"agent_tool,omitempty"`
}

// Confinement is what the plan's backend would enforce on this host for a
// run, and what it would lack.
type Confinement struct {
	// Mode is "transient unit", "process" or "container".
	Mode    string   `json:"mode"`
	Holds   []string `json:"holds,omitempty"`
	Missing []string `json:"missing,omitempty"`
}

// Wire is e as ExplainAgent returns it (JSON).
func (e Explanation) Wire() string { return jsonWire(e) }

// ExplanationFromWire reads what ExplainAgent returned.
func ExplanationFromWire(planJSON string) (Explanation, error) {
	var e Explanation
	if err := json.Unmarshal([]byte(planJSON), &e); err != nil {
		return Explanation{}, fmt.Errorf("%w: the plan is not the JSON of an explanation: %v", ErrInvalid, err)
	}
	return e, nil
}

// EgressVerdict is dev.berth.Scheduler1.ExplainEgress's answer: whether the
// egress proxy of the agent's next run would let the request pass, by which
// rule or why not, and the agent's network mode, since a run with a direct
// network (an admin's opt-in) never goes through the proxy. Its wire form
// is a JSON string (decision_json in the XML).
type EgressVerdict struct {
	Method  string `json:"method"`
	URL     string `json:"url"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule,omitempty"` // the rule that allowed it
	Reason  string `json:"reason"`         // why it was allowed or refused
	Note    string `json:"note,omitempty"` // what the decision could not know
	Agent   string `json:"agent"`
	Network string `json:"network"`          // the plan's network mode
	Direct  bool   `json:"direct,omitempty"` // unfiltered: the request bypasses the proxy
}

// Wire is v as ExplainEgress returns it (JSON).
func (v EgressVerdict) Wire() string { return jsonWire(v) }

// EgressVerdictFromWire reads what ExplainEgress returned.
func EgressVerdictFromWire(decisionJSON string) (EgressVerdict, error) {
	var v EgressVerdict
	if err := json.Unmarshal([]byte(decisionJSON), &v); err != nil {
		return EgressVerdict{}, fmt.Errorf("%w: the verdict is not the JSON of an egress verdict: %v", ErrInvalid, err)
	}
	return v, nil
}

// jsonWire is v as JSON. The values given are made of strings, numbers,
// booleans, slices and maps of them, which always encode.
func jsonWire(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("busapi: cannot encode %T: %v", v, err))
	}
	return string(data)
}
