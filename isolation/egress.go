package isolation

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Where a sandbox finds its run's egress socket and offers the proxy to its
// tools (docs/adr/0011-egress-gateway.md).
const (
	// SandboxEgressDir is where a container sees its run's socket directory.
	SandboxEgressDir = "/run/berth-egress"
	// EgressSocketName is the socket's name in its run's directory.
	EgressSocketName = "egress.sock"
	// EgressProxyPort is the port berth-agent serves the proxy on, on
	// 127.0.0.1 of the sandbox's own (empty) network namespace.
	EgressProxyPort = 3128
)

// EgressPlan is a run's way out: its socket, the destinations its egress
// rules allow and the provider endpoints it may call (keys stay in
// Plan.Providers, never here).
type EgressPlan struct {
	// Socket is the host path of the run's socket; SandboxSocket the same
	// socket as the agent sees it.
	Socket        string `json:"socket"`
	SandboxSocket string `json:"sandbox_socket"`
	// ProxyAddr is the loopback address berth-agent serves the proxy on.
	ProxyAddr string       `json:"proxy_addr"`
	Allow     []EgressRule `json:"allow,omitempty"`
	// Ask are the [agents.egress] ask rules: what no allow rule allows but
	// one of these matches is held until a person answers, for up to
	// ApprovalTimeout, then refused.
	Ask             []EgressRule  `json:"ask,omitempty"`
	ApprovalTimeout time.Duration `json:"approval_timeout,omitempty"`
	// ToolAsk are the [agents.tools] ask rules the proxy judges berth-agent's
	// tool asks by, held for up to ApprovalTimeout too.
	ToolAsk   []egresspolicy.ToolRule `json:"tool_ask,omitempty"`
	Providers []EgressProvider        `json:"providers,omitempty"`
	Proxy     EgressProxyProcess      `json:"proxy"`
	// Secrets are added by the proxy for their hosts, which it intercepts
	// with a CA made for the run; the sandbox trusts it through the bundle
	// at SandboxCABundle (CABundle on the host).
	Secrets         []EgressSecret `json:"secrets,omitempty"`
	CABundle        string         `json:"ca_bundle,omitempty"`
	SandboxCABundle string         `json:"sandbox_ca_bundle,omitempty"`
	// Agent names the agent in git's reasons. Git are its git rules, whose
	// hosts the proxy intercepts with the run's CA; GitHubApps the apps
	// their credentials name (the private keys are never marshalled).
	Agent      string                   `json:"agent,omitempty"`
	Git        []egresspolicy.GitRule   `json:"git,omitempty"`
	GitHubApps []egresspolicy.GitHubApp `json:"github_apps,omitempty"`
	// ReadOnly is [agents.egress] mode = "read-only": tools may only GET
	// and HEAD, without bodies, and every tunnel is read with the run's CA.
	ReadOnly bool `json:"read_only,omitempty"`
}

// EgressCABundleName is the CA bundle's name in the run's directory.
const EgressCABundleName = "ca.pem"

// The egress types live in internal/egresspolicy, the one place egress
// is decided; these names keep the plan's vocabulary.
type (
	EgressSecret   = egresspolicy.Secret
	EgressProvider = egresspolicy.Provider
	EgressRule     = egresspolicy.Rule
	EgressDecision = egresspolicy.Decision
	EgressVerdict  = egresspolicy.Verdict
)

// ParseEgressRule parses one allow entry; the error says what is wrong.
func ParseEgressRule(s string) (EgressRule, error) { return egresspolicy.ParseRule(s) }

// EgressProxyProcess is how the run's proxy is started.
type EgressProxyProcess struct {
	Binary string `json:"binary"`
	// User is the unprivileged user the proxy runs as ("" when the scheduler
	// is not root: then as the scheduler's own user).
	User string `json:"user,omitempty"`
}

// ProviderProxyURL is the base URL the agent calls a provider at: the
// in-sandbox proxy, which forwards to the run's egress proxy.
func ProviderProxyURL(proxyAddr, provider string) string {
	return "http://" + proxyAddr + "/providers/" + provider
}

// Judge is the plan's rules, providers and secrets as the proxy judges
// them, with res resolving names (nil: addresses left undecided) and addrs
// classifying addresses.
func (e *EgressPlan) Judge(res egresspolicy.Resolver, addrs *egresspolicy.Classifier) *egresspolicy.Judge {
	return &egresspolicy.Judge{Allow: e.Allow, Ask: e.Ask, Providers: e.Providers, Secrets: e.Secrets, Agent: e.Agent, Git: e.Git, ReadOnly: e.ReadOnly, Resolver: res, Addresses: addrs}
}

// DecideGit says what the run's proxy would do with a git fetch of remote
// or a push of ref to it, judged by the proxy's own code.
func (e *EgressPlan) DecideGit(op, remote, ref string) (EgressVerdict, error) {
	if e == nil {
		return EgressVerdict{Method: "git " + op, URL: remote, Reason: "the agent has no egress: its sandbox has a direct network, or nothing to reach (see sandbox explain)"}, nil
	}
	return e.Judge(nil, nil).ExplainGit(op, remote, ref)
}

// Decide says what the run's proxy would do with method on rawURL (https
// URLs travel as CONNECT; a URL on ProxyAddr under /providers/ is a
// provider call), judged by the proxy's own code.
func (e *EgressPlan) Decide(ctx context.Context, method, rawURL string, res egresspolicy.Resolver, addrs *egresspolicy.Classifier) (EgressVerdict, error) {
	if e == nil {
		v := EgressVerdict{Method: strings.ToUpper(method), URL: rawURL}
		if v.Method == "" {
			v.Method = "GET"
		}
		if u, err := url.Parse(rawURL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return v, fmt.Errorf("%q is not an absolute http(s) URL", rawURL)
		}
		v.Reason = "the agent has no egress: its sandbox has a direct network, or nothing to reach (see sandbox explain)"
		return v, nil
	}
	return e.Judge(res, addrs).Explain(ctx, egresspolicy.Question{Method: method, URL: rawURL, ProxyAddr: e.ProxyAddr})
}

// KeepReadable lets a host run read keep (the run's egress directory, with
// its CA bundle) although a denied directory holds it: each deny that
// contains keep is replaced by the entries that do not lead to it, as
// HostPolicy does for the workspace.
func KeepReadable(p agentproto.Policy, keep string) agentproto.Policy {
	if p.Unrestricted {
		return p
	}
	res := newResolver()
	k := res.resolved(keep)
	var deny []string
	for _, d := range p.Deny {
		deny = append(deny, res.carveOut(d, k)...)
	}
	p.Deny = cleanUnique(deny)
	p.AllowRead = cleanUnique(append(slices.Clone(p.AllowRead), keep))
	return p
}
