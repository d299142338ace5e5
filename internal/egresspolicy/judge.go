package egresspolicy

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Decision is one request the proxy decided.
type Decision struct {
	Time   time.Time `json:"time"`
	Method string    `json:"method"`
	Host   string    `json:"host"`
	Port   int       `json:"port"`
	Path   string    `json:"path,omitempty"`
	// Ref is the ref a git push would update (one decision per ref).
	Ref     string `json:"ref,omitempty"`
	Allowed bool   `json:"allowed"`
	// Rule is the rule or provider that allowed it; Reason why it was refused.
	Rule      string `json:"rule,omitempty"`
	Reason    string `json:"reason,omitempty"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
}

// Resolver resolves destination names (the proxy's resolver, never the
// sandbox's).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Judge decides a run's requests: the proxy for each request it serves,
// explain for a request asked about.
type Judge struct {
	Allow []Rule
	// Ask are the [agents.egress] ask rules: a request no allow rule, git
	// rule or provider allows, but one of these matches, waits for a
	// person's answer instead of being refused (ask.go).
	Ask       []Rule
	Providers []Provider
	Secrets   []Secret
	// Agent names the agent in git's reasons; Git are its git rules
	// (git.go): their hosts are reached for git only, unless a rule allows more.
	Agent string
	Git   []GitRule
	// ReadOnly is [agents.egress] mode = "read-only" (readonly.go).
	ReadOnly bool
	// Resolver resolves names a rule could allow; nil leaves the address
	// undecided (explain without a resolver says so in its note).
	Resolver Resolver
	// Addresses says which addresses are internal; nil judges the
	// special-purpose ranges only.
	Addresses *Classifier
	// AgentChannel judges berth-agent's own requests (its agent token):
	// rules and secrets of its own tools (AgentTool) apply too (channel.go).
	AgentChannel bool
}

// Destination is where a tool's request may go: the rule that allows it
// and the addresses it may be sent to (those the rule allows, in the
// resolver's order). Addrs is nil when the judge has no resolver.
type Destination struct {
	Rule  Rule
	Addrs []netip.Addr
}

// Destination judges method to host:port for a tool, with one rule for
// everything: it must match host, port and method, and only when that same
// rule names the host exactly may an internal address be reached. A name
// is resolved only once a rule could allow the request, so a tool cannot
// make the proxy's resolver look up names no rule allows.
func (j *Judge) Destination(ctx context.Context, method, host string, port int) (Destination, *Refusal) {
	host = NormalHost(host)
	if _, err := netip.ParseAddr(host); err != nil && !ValidHostname(host) {
		// Userinfo, spaces or other junk in a target: what a "*" rule would
		// otherwise hand to the resolver.
		return Destination{}, refused(http.StatusBadRequest, "%q is not a host name or an IP address", host)
	}
	if port < 1 || port > 65535 {
		return Destination{}, refused(http.StatusBadRequest, "port %d is not 1-65535", port)
	}
	rule, ok := MatchRule(j.channelRules(), method, host, port)
	if !ok {
		rule, ok = j.gitHostRule(method, host, port)
	}
	if !ok {
		// Allow beats ask, ask beats the default deny.
		if ask, asked := MatchRule(j.Ask, method, host, port); asked {
			return Destination{}, askRefusal(ask)
		}
	}
	if why := j.agentOnly(method, host, port); !ok && why != "" {
		return Destination{}, refused(http.StatusForbidden, "%s", why)
	}
	if !ok {
		return Destination{}, refused(http.StatusForbidden, "%s", NoRule(method, host, port))
	}
	return j.DestinationBy(ctx, rule, host, port)
}

// DestinationBy judges the addresses of host:port for rule, a rule already
// chosen for the request (by Destination, or an ask rule a person approved):
// only when rule names the host exactly may an internal address be reached.
func (j *Judge) DestinationBy(ctx context.Context, rule Rule, host string, port int) (Destination, *Refusal) {
	host = NormalHost(host)
	d := Destination{Rule: rule}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if j.Resolver == nil {
		return d, nil
	} else {
		addrs, err = j.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil || len(addrs) == 0 {
			why := "it has no address"
			if err != nil {
				why = err.Error()
			}
			return d, refused(http.StatusBadGateway, "cannot resolve %s: %s", host, why)
		}
	}
	refusal := ""
	for _, a := range addrs {
		a = a.Unmap()
		if why := j.Addresses.Internal(a); why != "" && !rule.Names(host) {
			if refusal == "" {
				refusal = fmt.Sprintf("%s resolves to %s, %s; only a rule naming %s exactly allows that (rule %s does not)", host, a, why, host, rule.Raw)
			}
			continue
		}
		d.Addrs = append(d.Addrs, a)
	}
	if len(d.Addrs) == 0 {
		return Destination{}, refused(http.StatusForbidden, "%s", refusal)
	}
	return d, nil
}

// SecretFor is the secret a tunnel to host:port is intercepted for, if any.
func (j *Judge) SecretFor(host string, port int) *Secret {
	for i := range j.Secrets {
		// A git rule's credential goes to its repositories only (git.go).
		if j.Secrets[i].For(host, port) && j.onChannel(j.Secrets[i].AgentTool) && !j.GitCredential(j.Secrets[i].Name) {
			return &j.Secrets[i]
		}
	}
	return nil
}

// Verdict is what the egress proxy would decide for one request
// (berthctl egress explain).
type Verdict struct {
	Method  string `json:"method"`
	URL     string `json:"url"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason"`
	Note    string `json:"note,omitempty"`
}

// Question is a request to explain: Method and an absolute URL; for an
// https URL, the request inside the tunnel may name its Host (fronting);
// for a provider call, Body is what would be sent.
type Question struct {
	Method string
	URL    string
	// ProxyAddr is where the sandbox reaches the proxy: a URL on it under
	// ProvidersPrefix is a provider call.
	ProxyAddr string
	Host      string
	Body      []byte
}

// Explain says what the proxy would decide for q, with the code the proxy
// decides with.
func (j *Judge) Explain(ctx context.Context, q Question) (Verdict, error) {
	v := Verdict{Method: strings.ToUpper(q.Method), URL: q.URL}
	if v.Method == "" {
		v.Method = http.MethodGet
	}
	u, err := url.Parse(q.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return v, fmt.Errorf("%q is not an absolute http(s) URL", q.URL)
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return v, fmt.Errorf("%q has no valid port", q.URL)
		}
	}
	host := NormalHost(u.Hostname())
	refuse := func(r *Refusal) (Verdict, error) {
		v.Allowed, v.Rule, v.Reason = false, "", r.Reason
		return v, nil
	}
	if q.ProxyAddr != "" && u.Scheme == "http" && u.Host == q.ProxyAddr && strings.HasPrefix(u.EscapedPath(), ProvidersPrefix) {
		call, r := j.Provider(v.Method, u.EscapedPath())
		if r != nil {
			return refuse(r)
		}
		v.Rule = "provider " + call.Provider.Name
		if call.NeedsModel() {
			if q.Body == nil {
				v.Note = fmt.Sprintf("only if the body names model %q (a JSON object, that key once)", call.Provider.Model)
			} else if err := CheckModel(q.Body, call.Provider.Model); err != nil {
				return refuse(refused(http.StatusForbidden, "provider %s: %v", call.Provider.Name, err))
			}
		}
		v.Allowed, v.Reason = true, fmt.Sprintf("a call of provider %s at %s, with the key added by the proxy", call.Provider.Name, call.URL)
		return v, nil
	}
	method := v.Method
	if u.Scheme == "https" {
		method = http.MethodConnect
	}
	for _, pr := range j.Providers {
		if strings.HasPrefix(q.URL, strings.TrimSuffix(pr.BaseURL, "/")) {
			v.Note = fmt.Sprintf("provider %s: the agent reaches it through the proxy at %s, with the key added, only on its endpoints (%s) with model %q",
				pr.Name, ProvidersPrefix+pr.Name, strings.Join(pr.ProviderEndpoints(), ", "), pr.Model)
		}
	}
	dest, r := j.Destination(ctx, method, host, port)
	if r != nil && r.Code == http.StatusBadGateway {
		// The rule allows it; the name does not resolve here and now, which
		// the proxy would answer with 502, not a refusal of policy.
		v.Allowed, v.Rule, v.Reason = true, dest.Rule.Raw, "allowed by rule "+dest.Rule.Raw
		v.Note = joinNote(v.Note, r.Reason+" (now, from the scheduler: the proxy resolves when the request is sent and refuses an internal address unless the rule names the host)")
		return v, nil
	}
	if r != nil && r.Ask == nil && method == http.MethodConnect && r.Code == http.StatusForbidden && j.AsksInside(host, port) {
		// The tunnel opens for its inside asks: the request's own method
		// is judged (askinside.go).
		if ask, ir := j.InsideAsk(v.Method, host, port); ir == nil {
			r = askRefusal(ask)
			v.Note = joinNote(v.Note, "TLS intercepted with the run's CA: the request inside is judged with its own method")
		} else if v.Method != http.MethodConnect {
			return refuse(ir)
		}
	}
	if r != nil && r.Ask != nil {
		v.Allowed, v.Rule, v.Reason = false, r.Ask.Raw, r.Reason
		v.Note = joinNote(v.Note, "held until a person answers (berthctl approvals, or the conversation); refused when nobody does within approval_timeout")
		return v, nil
	}
	if r != nil {
		return refuse(r)
	}
	v.Allowed, v.Rule, v.Reason = true, dest.Rule.Raw, "allowed by rule "+dest.Rule.Raw
	if dest.Addrs == nil && !dest.Rule.Names(host) {
		v.Note = joinNote(v.Note, "refused when sent if "+host+" resolves to an internal address (loopback, private, link-local, this host's networks or gateways): no rule names it exactly")
	}
	if method == http.MethodConnect && j.GitHost(host, port) {
		v.Note = joinNote(v.Note, gitHostNote(j, host, port))
	}
	if method == http.MethodConnect {
		if sec := j.SecretFor(host, port); sec != nil && v.Method == http.MethodConnect {
			v.Rule = "secret " + sec.Name
			v.Note = joinNote(v.Note, fmt.Sprintf("TLS intercepted with the run's CA: each request inside must name %s as its Host, and gets secret %s where its scope allows", u.Host, sec.Name))
		} else if sec != nil {
			v.Rule = "secret " + sec.Name
			inner := &http.Request{Method: v.Method, Host: q.Host, URL: &url.URL{Path: u.EscapedPath()}}
			if inner.Host == "" {
				inner.Host = u.Host
			}
			if err := CheckFronting(host, port, inner); err != nil {
				return refuse(refused(http.StatusForbidden, "secret %s: %v", sec.Name, err))
			}
			if ok, why := sec.Covers(v.Method, pathOrRoot(u.EscapedPath())); ok {
				v.Note = joinNote(v.Note, fmt.Sprintf("TLS intercepted with the run's CA: secret %s is added as %s", sec.Name, sec.Header))
			} else {
				v.Note = joinNote(v.Note, "TLS intercepted with the run's CA: "+why)
			}
		}
	}
	return v, nil
}

func pathOrRoot(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
