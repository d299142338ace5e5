package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// Explained is what dev.berth.Scheduler1.ExplainAgent returns (as JSON): the
// plan the agent's next run would get with the current config, why, what
// would refuse it, and how the backend confines it on this host. No key.
type Explained struct {
	runplan.Explanation
	// BackendAvailable says this scheduler has the plan's backend.
	BackendAvailable bool                   `json:"backend_available"`
	Confinement      *isolation.Confinement `json:"confinement,omitempty"`
}

// ExplainAgentJSON is the run plan the scheduler would use for agent's next
// run, as JSON (dev.berth.Scheduler1.ExplainAgent): the very plan runOnce
// compiles, with the keys left out.
func (s *Service) ExplainAgentJSON(agent string) (string, error) {
	cfg := s.cfg.Load()
	// The agent's own uid is allocated here if no run has yet: the plan
	// shows the very user its runs get.
	host := s.agentFacts(cfg, agent)
	e, err := runplan.Explain(cfg, agent, host)
	if isolation.ReasonOf(err) == isolation.ReasonAgentNotConfigured {
		return "", fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if err != nil {
		return "", fmt.Errorf("cannot explain agent %s: %w", agent, err)
	}
	out := Explained{Explanation: e}
	b := s.opts.Backends[string(e.Plan.Backend)]
	out.BackendAvailable = b != nil
	if b == nil {
		out.Problems = append(out.Problems, fmt.Sprintf("this scheduler has no %s backend: runs of %s fail", e.Plan.Backend, agent))
	}
	if ex, ok := b.(isolation.Explainer); ok {
		c := ex.Explain(e.Plan)
		out.Confinement = &c
	}
	data, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("cannot encode the plan of %s: %w", agent, err)
	}
	return string(data), nil
}

// TestProviders checks providers with the scheduler's own environment
// (dev.berth.Scheduler1.TestProviders): each is called once by a run of an
// agent that uses it (probe.go), through that run's backend and egress
// proxy, so what passes here is what runs get. name "" means every
// configured provider.
func (s *Service) TestProviders(name string) ([]map[string]dbus.Variant, error) {
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
	out := make([]map[string]dbus.Variant, len(names))
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
func (s *Service) providerResult(cfg *config.Config, name string, res agentproto.ProbeResult) map[string]dbus.Variant {
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
	return map[string]dbus.Variant{
		"name":       dbus.MakeVariant(name),
		"kind":       dbus.MakeVariant(kind),
		"model":      dbus.MakeVariant(e.Model),
		"base_url":   dbus.MakeVariant(e.BaseURL),
		"status":     dbus.MakeVariant(res.Verdict),
		"detail":     dbus.MakeVariant(detail),
		"latency_ms": dbus.MakeVariant(uint32(res.LatencyMS)),
	}
}

// ExplainEgressJSON says, as JSON, whether the egress proxy of agent's next
// run would let method reach rawURL, and why (berthctl egress explain). It
// decides with the very rules and providers runOnce would hand the proxy.
func (s *Service) ExplainEgressJSON(agent, method, rawURL string) (string, error) {
	cfg := s.cfg.Load()
	e, err := runplan.Explain(cfg, agent, s.hostFacts(cfg))
	if isolation.ReasonOf(err) == isolation.ReasonAgentNotConfigured {
		return "", fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if err != nil {
		return "", fmt.Errorf("cannot explain the egress of %s: %w", agent, err)
	}
	target, err := egressTarget(method, rawURL)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	// The proxy's own judging, with a resolver as the proxy has one: an
	// internal address is decided as it would be.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := e.Plan.Egress.Decide(ctx, method, target, s.opts.Resolver, egresspolicy.HostClassifier())
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	v.URL = rawURL
	out := EgressExplained{EgressVerdict: v, Agent: agent, Network: e.Plan.Network.Mode}
	if e.Plan.Network.Allowed || e.Plan.Backend == isolation.BackendUnrestricted {
		out.Allowed, out.Direct, out.Rule = true, true, ""
		out.Reason = "not filtered: the sandbox has a direct network, so its requests bypass the egress proxy; network: " + e.Why["network"]
		out.Note = ""
	}
	data, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("cannot encode the egress verdict: %w", err)
	}
	return string(data), nil
}

// EgressExplained is dev.berth.Scheduler1.ExplainEgress's JSON: the proxy's
// verdict and the agent's network mode, since a run with a direct network
// (an admin's opt-in) never goes through the proxy.
type EgressExplained struct {
	isolation.EgressVerdict
	Agent string `json:"agent"`
	// Network is the plan's network mode: "none" (only the run's egress
	// socket), "host" or "bridge" (direct and unfiltered).
	Network string `json:"network"`
	// Direct says the request bypasses the proxy: it passes unfiltered.
	Direct bool `json:"direct,omitempty"`
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
	out, err := o.s.ExplainEgressJSON(agent, method, rawURL)
	if err != nil {
		return "", dbusError(err)
	}
	return out, nil
}
