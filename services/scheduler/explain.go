package scheduler

import (
	"context"
	"fmt"
	"maps"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// ExplainAgent is the plan of agent's next run with the current config
// (dev.berth.Scheduler1.ExplainAgent): the very plan runOnce compiles, in
// its bus form, which has no field for a key; why, what would refuse it,
// and how the backend confines it on this host.
func (s *Service) ExplainAgent(agent string) (busapi.Explanation, error) {
	cfg := s.cfg.Load()
	// The agent's own uid is allocated here if no run has yet: the plan
	// shows the very user its runs get.
	host := s.agentFacts(cfg, agent)
	e, err := runplan.Explain(cfg, agent, host)
	if isolation.ReasonOf(err) == isolation.ReasonAgentNotConfigured {
		return busapi.Explanation{}, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if err != nil {
		return busapi.Explanation{}, fmt.Errorf("cannot explain agent %s: %w", agent, err)
	}
	out := busapi.Explanation{Plan: busPlan(e.Plan), Why: e.Why, Problems: e.Problems}
	b := s.opts.Backends[string(e.Plan.Backend)]
	out.BackendAvailable = b != nil
	if b == nil {
		out.Problems = append(out.Problems, fmt.Sprintf("this scheduler has no %s backend: runs of %s fail", e.Plan.Backend, agent))
	}
	if ex, ok := b.(isolation.Explainer); ok {
		c := busapi.Confinement(ex.Explain(e.Plan))
		out.Confinement = &c
	}
	return out, nil
}

// busPlan is p as the bus shows it. The types that cannot hold a secret
// convert as they are, so a field added to one of them fails to compile
// here until the bus carries it; the rest are copied field by field, keys
// and secret values left behind.
func busPlan(p isolation.Plan) busapi.Plan {
	out := busapi.Plan{
		Backend:          string(p.Backend),
		RunID:            p.RunID,
		Attempt:          p.Attempt,
		AgentID:          p.AgentID,
		AgentBinary:      p.AgentBinary,
		RunAs:            p.RunAs,
		Workspace:        p.Workspace,
		SandboxWorkspace: p.SandboxWorkspace,
		Policy:           busapi.Policy(p.Policy),
		Protected:        p.Protected,
		Limits:           busapi.Limits(p.Limits),
		Network:          busapi.Network(p.Network),
		Container:        busapi.ContainerPlan(p.Container),
		Kube: busapi.KubePlan{Namespace: p.Kube.Namespace, Image: p.Kube.Image, ImagePullPolicy: p.Kube.ImagePullPolicy,
			RuntimeClass: p.Kube.RuntimeClass, NodeSelector: p.Kube.NodeSelector, ServiceAccount: p.Kube.ServiceAccount,
			ProxyAddr: p.Kube.ProxyAddr, EgressVerifiedBy: p.Kube.EgressVerifiedBy, Warm: p.Kube.Warm,
			Workspace: p.Kube.Workspace, StorageClass: p.Kube.StorageClass, WorkspaceSize: p.Kube.WorkspaceSize, AccessMode: p.Kube.AccessMode},
		Providers: make([]busapi.Provider, len(p.Providers)),
		Timeout:   p.Timeout,
		KillGrace: p.KillGrace,
	}
	for _, t := range p.Kube.Tolerations {
		out.Kube.Tolerations = append(out.Kube.Tolerations, busapi.KubeToleration(t))
	}
	if p.User != nil {
		u := busapi.RunUser(*p.User)
		out.User = &u
	}
	for _, m := range p.Mounts {
		out.Mounts = append(out.Mounts, busapi.Mount(m))
	}
	for i, pr := range p.Providers {
		out.Providers[i] = busapi.Provider{Name: pr.Name, Kind: pr.Kind, BaseURL: pr.BaseURL, Model: pr.Model, MaxTokens: pr.MaxTokens, Proxied: pr.Proxied, Endpoint: pr.Endpoint}
	}
	if e := p.Egress; e != nil {
		be := &busapi.EgressPlan{Socket: e.Socket, SandboxSocket: e.SandboxSocket, ProxyAddr: e.ProxyAddr,
			Proxy: busapi.EgressProxyProcess(e.Proxy), CABundle: e.CABundle, SandboxCABundle: e.SandboxCABundle}
		for _, r := range e.Allow {
			be.Allow = append(be.Allow, busapi.EgressRule(r))
		}
		for _, pr := range e.Providers {
			be.Providers = append(be.Providers, busapi.EgressProvider{Name: pr.Name, Kind: pr.Kind, BaseURL: pr.BaseURL, Model: pr.Model,
				Endpoints: pr.Endpoints, APIVersion: pr.APIVersion, Organization: pr.Organization, Project: pr.Project})
			if len(pr.Prices) > 0 {
				last := &be.Providers[len(be.Providers)-1]
				last.Prices = make(map[string]busapi.Price, len(pr.Prices))
				for m, price := range pr.Prices {
					last.Prices[m] = busapi.Price(price)
				}
			}
		}
		for _, sec := range e.Secrets {
			be.Secrets = append(be.Secrets, busapi.EgressSecret{Name: sec.Name, Hosts: sec.Hosts, Header: sec.Header, Format: sec.Format,
				Ports: sec.Ports, Methods: sec.Methods, Paths: sec.Paths, AgentTool: sec.AgentTool})
		}
		be.Agent, be.ReadOnly, be.ApprovalTimeout = e.Agent, e.ReadOnly, e.ApprovalTimeout
		for _, r := range e.Ask {
			be.Ask = append(be.Ask, busapi.EgressRule(r))
		}
		for _, r := range e.ToolAsk {
			be.ToolAsk = append(be.ToolAsk, busapi.ToolAskRule(r))
		}
		for _, g := range e.Git {
			be.Git = append(be.Git, busapi.GitRule(g))
		}
		for _, a := range e.GitHubApps {
			be.GitHubApps = append(be.GitHubApps, busapi.GitHubApp{Name: a.Name, AppID: a.AppID, InstallationID: a.InstallationID, APIBaseURL: a.APIBaseURL})
		}
		out.Egress = be
	}
	return out
}

// TestProviders checks providers with the scheduler's own environment
// (dev.berth.Scheduler1.TestProviders): each is called once by a run of an
// agent that uses it (probe.go), through that run's backend and egress
// proxy, so what passes here is what runs get. name "" means every
// configured provider.
func (s *Service) TestProviders(name string) ([]busapi.ProviderResult, error) {
	cfg := s.cfg.Load()
	names := make([]string, 0, len(cfg.Providers.Entries))
	for n := range cfg.Providers.Entries {
		names = append(names, n)
	}
	sort.Strings(names)
	if name != "" {
		if _, ok := cfg.Providers.Entries[name]; !ok {
			return nil, fmt.Errorf("%w: provider %q is not defined (defined: %s)", ErrNotFound, name, strings.Join(names, ", "))
		}
		names = []string{name}
	}
	results := map[string]agentproto.ProbeResult{}
	var remote []string
	for _, n := range names {
		e := cfg.Providers.Entries[n]
		switch {
		case providerKind(n, e) == "local":
			results[n] = agentproto.ProbeResult{Provider: n, Verdict: "ok", Detail: "offline; nothing to reach"}
		case e.APIKeyEnv != "" && s.opts.Getenv(e.APIKeyEnv) == "":
			results[n] = agentproto.ProbeResult{Provider: n, Verdict: "error", Detail: fmt.Sprintf("%s is not set in the scheduler's environment (set it in the unit, e.g. systemctl edit berth-scheduler: Environment= or EnvironmentFile=)", e.APIKeyEnv)}
		default:
			remote = append(remote, n)
		}
	}
	if len(remote) > 0 {
		maps.Copy(results, s.probeProviders(cfg, remote))
	}
	out := make([]busapi.ProviderResult, len(names))
	for i, n := range names {
		out[i] = s.providerResult(cfg, n, results[n])
	}
	return out, nil
}

// providerKind is the kind of provider name: its kind, else its name.
func providerKind(name string, e config.Provider) string {
	if e.Kind == "" {
		return name
	}
	return e.Kind
}

// providerResult is one provider's row of TestProviders; the result never
// holds the key (the agent never had it when its provider is proxied, and
// redacts it when the run has a direct network; redacted here once more).
func (s *Service) providerResult(cfg *config.Config, name string, res agentproto.ProbeResult) busapi.ProviderResult {
	e := cfg.Providers.Entries[name]
	kind := providerKind(name, e)
	detail := res.Detail
	if e.APIKeyEnv != "" {
		if key := s.opts.Getenv(e.APIKeyEnv); key != "" {
			detail = strings.ReplaceAll(detail, key, "[key]")
		}
	}
	latency := time.Duration(res.LatencyMS) * time.Millisecond
	s.log.Info("provider checked", "provider", name, "kind", kind, "status", res.Verdict, "latency", latency)
	return busapi.ProviderResult{Name: name, Kind: kind, Model: e.Model, BaseURL: e.BaseURL, Status: res.Verdict, Detail: detail, LatencyMS: uint32(res.LatencyMS)}
}

// ExplainEgress says whether the egress proxy of agent's next run would let
// method reach rawURL, and why (berthctl egress explain). It decides with
// the very rules and providers runOnce would hand the proxy.
func (s *Service) ExplainEgress(agent, method, rawURL string) (busapi.EgressVerdict, error) {
	cfg := s.cfg.Load()
	e, err := runplan.Explain(cfg, agent, s.hostFacts(cfg))
	if isolation.ReasonOf(err) == isolation.ReasonAgentNotConfigured {
		return busapi.EgressVerdict{}, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if err != nil {
		return busapi.EgressVerdict{}, fmt.Errorf("cannot explain the egress of %s: %w", agent, err)
	}
	if op, ref, isGit := busapi.ParseGitMethod(method); isGit {
		return explainGit(e, agent, method, op, rawURL, ref)
	}
	target, err := egressTarget(method, rawURL)
	if err != nil {
		return busapi.EgressVerdict{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	// The proxy's own judging, with a resolver as the proxy has one: an
	// internal address is decided as it would be.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := e.Plan.Egress.Decide(ctx, method, target, s.opts.Resolver, egresspolicy.HostClassifier())
	if err != nil {
		return busapi.EgressVerdict{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	v.URL = rawURL
	out := busVerdict(v, agent, e.Plan.Network.Mode)
	if e.Plan.Network.Allowed || e.Plan.Backend == isolation.BackendUnrestricted {
		out.Allowed, out.Direct, out.Rule = true, true, ""
		out.Reason = "not filtered: the sandbox has a direct network, so its requests bypass the egress proxy; network: " + e.Why["network"]
		out.Note = ""
	}
	return out, nil
}

// busVerdict is the proxy's verdict v for agent, whose plan's network mode
// is network, as the bus carries it.
func busVerdict(v isolation.EgressVerdict, agent, network string) busapi.EgressVerdict {
	return busapi.EgressVerdict{Method: v.Method, URL: v.URL, Allowed: v.Allowed, Rule: v.Rule, Reason: v.Reason, Note: v.Note,
		Agent: agent, Network: network}
}

// egressTarget makes what ExplainEgress was given a URL the proxy's rules
// can decide: CONNECT takes a bare host:port, as a tunnel request does.
func egressTarget(method, rawURL string) (string, error) {
	if strings.Contains(rawURL, "://") {
		return rawURL, nil
	}
	if strings.EqualFold(method, "CONNECT") {
		if _, _, err := net.SplitHostPort(rawURL); err == nil && !strings.Contains(rawURL, "/") {
			return "https://" + rawURL, nil
		}
		return "", fmt.Errorf("%q is not host:port, the target of a CONNECT", rawURL)
	}
	return "", fmt.Errorf("%q has no scheme: say https://%s (a tunnel, decided as CONNECT) or http://%s (decided per request), or CONNECT host:port", rawURL, rawURL, rawURL)
}

// ExplainEgress answers dev.berth.Scheduler1.ExplainEgress with the same
// caller check as ExplainAgent: the verdict names the agent's rules.
func (o *schedulerObject) ExplainEgress(sender dbus.Sender, agent, method, rawURL string) (string, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return "", derr
	}
	v, err := o.s.ExplainEgress(agent, method, rawURL)
	if err != nil {
		return "", dbusError(err)
	}
	return v.Wire(), nil
}
