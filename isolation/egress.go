package isolation

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
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
	// MaxEgressDecisions bounds the decisions kept per run.
	MaxEgressDecisions = 200
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
	ProxyAddr string             `json:"proxy_addr"`
	Allow     []EgressRule       `json:"allow,omitempty"`
	Providers []EgressProvider   `json:"providers,omitempty"`
	Proxy     EgressProxyProcess `json:"proxy"`
	// Secrets are added by the proxy for their hosts, which it intercepts
	// with a CA made for the run; the sandbox trusts it through the bundle
	// at SandboxCABundle (CABundle on the host).
	Secrets         []EgressSecret `json:"secrets,omitempty"`
	CABundle        string         `json:"ca_bundle,omitempty"`
	SandboxCABundle string         `json:"sandbox_ca_bundle,omitempty"`
}

// EgressCABundleName is the CA bundle's name in the run's directory.
const EgressCABundleName = "ca.pem"

// EgressSecret is an [[egress.secrets]] entry that applies to the run.
// Value never leaves the scheduler but to the proxy: it is not marshalled.
type EgressSecret struct {
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	Format string   `json:"format"`
	Value  string   `json:"-"`
}

// EgressProvider is a provider the run may call: its endpoint and the only
// model the proxy lets through.
type EgressProvider struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
}

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

// EgressDecision is one request the proxy decided.
type EgressDecision struct {
	Time    time.Time `json:"time"`
	Method  string    `json:"method"`
	Host    string    `json:"host"`
	Port    int       `json:"port"`
	Path    string    `json:"path,omitempty"`
	Allowed bool      `json:"allowed"`
	// Rule is the rule or provider that allowed it; Reason why it was refused.
	Rule      string `json:"rule,omitempty"`
	Reason    string `json:"reason,omitempty"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
}

// EgressRule is one [agents.egress] allow entry: "[METHOD[,METHOD…] ]host[:port]".
// host is a name, an IP or a glob whose "*." prefix matches one or more
// labels; without a port, 80 and 443 are allowed.
type EgressRule struct {
	Raw     string   `json:"rule"`
	Host    string   `json:"host"`
	Port    int      `json:"port,omitempty"`
	Methods []string `json:"methods,omitempty"`
}

var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"}

// ParseEgressRule parses one allow entry; the error says what is wrong.
func ParseEgressRule(s string) (EgressRule, error) {
	r := EgressRule{Raw: s}
	fields := strings.Fields(s)
	switch len(fields) {
	case 1:
	case 2:
		for m := range strings.SplitSeq(fields[0], ",") {
			m = strings.ToUpper(m)
			if !slices.Contains(httpMethods, m) {
				return EgressRule{}, fmt.Errorf("%q: %q is not an HTTP method (%s)", s, m, strings.Join(httpMethods, ", "))
			}
			r.Methods = append(r.Methods, m)
		}
	default:
		return EgressRule{}, fmt.Errorf("%q: want \"host\", \"host:port\" or \"METHODS host[:port]\"", s)
	}
	hostport := fields[len(fields)-1]
	if strings.Contains(hostport, "/") {
		return EgressRule{}, fmt.Errorf("%q: a rule names a host, not a URL", s)
	}
	host := hostport
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return EgressRule{}, fmt.Errorf("%q: port %q is not 1-65535", s, p)
		}
		host, r.Port = h, port
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return EgressRule{}, fmt.Errorf("%q: no host", s)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		glob := strings.TrimPrefix(host, "*.")
		if host != "*" && (strings.Contains(glob, "*") || !validHostname(glob)) {
			return EgressRule{}, fmt.Errorf("%q: %q is not a host name, an IP address or a \"*.\" glob", s, host)
		}
	}
	r.Host = host
	return r, nil
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Matches says whether the rule allows method to host:port.
func (r EgressRule) Matches(method, host string, port int) bool {
	if len(r.Methods) > 0 && !slices.Contains(r.Methods, strings.ToUpper(method)) {
		return false
	}
	if r.Port != 0 && r.Port != port || r.Port == 0 && port != 80 && port != 443 {
		return false
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case r.Host == "*":
		return true
	case strings.HasPrefix(r.Host, "*."):
		return strings.HasSuffix(host, r.Host[1:]) && len(host) > len(r.Host)-1
	}
	return host == r.Host
}

// Names says whether the rule names host exactly (no glob): only such a rule
// lets the proxy reach a loopback, private or link-local destination.
func (r EgressRule) Names(host string) bool {
	return !strings.Contains(r.Host, "*") && r.Host == strings.ToLower(strings.TrimSuffix(host, "."))
}

// MatchEgressRule is the rule that lets method reach host:port: one naming
// the host exactly first (it is what lets an internal address through),
// else the first that matches.
func MatchEgressRule(rules []EgressRule, method, host string, port int) (EgressRule, bool) {
	first := -1
	for i, r := range rules {
		if !r.Matches(method, host, port) {
			continue
		}
		if r.Names(host) {
			return r, true
		}
		if first < 0 {
			first = i
		}
	}
	if first < 0 {
		return EgressRule{}, false
	}
	return rules[first], true
}

// EgressVerdict is what the egress proxy would decide for one request
// (berthctl egress explain). Internal addresses are decided at dial time,
// after the proxy resolved the name: Note says so.
type EgressVerdict struct {
	Method  string `json:"method"`
	URL     string `json:"url"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason"`
	Note    string `json:"note,omitempty"`
}

// Decide says what the run's proxy would do with method on rawURL (https
// URLs travel as CONNECT).
func (e *EgressPlan) Decide(method, rawURL string) (EgressVerdict, error) {
	v := EgressVerdict{Method: strings.ToUpper(method), URL: rawURL}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return v, fmt.Errorf("%q is not an absolute http(s) URL", rawURL)
	}
	if v.Method == "" {
		v.Method = "GET"
	}
	if e == nil {
		v.Reason = "the agent has no egress: its sandbox has a direct network, or nothing to reach (see sandbox explain)"
		return v, nil
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	}
	host := strings.ToLower(u.Hostname())
	for _, pr := range e.Providers {
		if strings.HasPrefix(rawURL, strings.TrimSuffix(pr.BaseURL, "/")) {
			v.Note = fmt.Sprintf("provider %s: the agent reaches it at its base URL, with the key added by the proxy, only as POST with model %q", pr.Name, pr.Model)
		}
	}
	method = v.Method
	if u.Scheme == "https" {
		method = "CONNECT"
	}
	r, ok := MatchEgressRule(e.Allow, method, host, port)
	if !ok {
		v.Reason = fmt.Sprintf("no [agents.egress] allow rule matches %s %s:%d", method, host, port)
		return v, nil
	}
	v.Allowed, v.Rule = true, r.Raw
	v.Reason = "allowed by rule " + r.Raw
	if !r.Names(host) {
		v.Note = strings.TrimPrefix(v.Note+"; refused at dial time if "+host+" resolves to a loopback, private, link-local or this host's address (no rule names it exactly)", "; ")
	}
	return v, nil
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
