package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The project's own attack corpus against the egress gateway (issue 19),
// run through real runs on both backends: a static probe in the sandbox's
// workspace plays the attacker with a shell, sending raw bytes to the
// in-sandbox proxy, the run's socket and through tunnels. Every attack has
// a control (the same target named by a rule, the right model, the right
// Host) that gets through, so a refusal is the wall and not a typo. An
// attack that gets through fails the build.

const (
	attackKey    = "sk-attack-e2e-provider-key-4d1c"
	attackSecret = "secret-e2e-9b2f7a-never-elsewhere"
	// secretName is the [[egress.secrets]] host: a name every host resolves
	// (to loopback, which a rule naming it exactly lets the proxy reach).
	secretName = "localhost"
	probeName  = "berth-attack-probe"
	relay      = "tcp:127.0.0.1:3128"
)

var attackProbe struct {
	once sync.Once
	path string
	err  error
}

// attackWorld is one suite's upstreams and what the cases aim at.
type attackWorld struct {
	internal *recorder // every address of the host: the SSRF target, "*:PORT" allows its port
	crossing *recorder // every address: "GET,HEAD 127.0.0.2:PORT" names it
	upstream *recorder // 127.0.0.3, named by a rule: the allowed, public-looking upstream
	provider *recorder // 127.0.0.1: the agent's OpenAI-compatible provider
	secret   *recorder // TLS on 127.0.0.1 as secretName, the [[egress.secrets]] host
	plainTLS *recorder // TLS on 127.0.0.3, allowed but not a secret's host
	all      []*recorder

	caFile   string
	tmpSock  string
	gateway  string   // the Docker bridge's address on the host
	ownAddrs []string // the host's other addresses, URL-ready
	neighbor string   // an address in the subnet of one of them
}

func newAttackWorld(t *testing.T) *attackWorld {
	t.Helper()
	caPEM, leaf := testCA(t, secretName)
	f, err := os.CreateTemp(baseDir, "atk-ca-*.pem")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(caPEM)
	f.Close()
	os.Chmod(f.Name(), 0o644) // the egress user reads it
	t.Cleanup(func() { os.Remove(f.Name()) })
	w := &attackWorld{caFile: f.Name()}
	w.internal = serveRecorder(t, &recorder{name: "internal"}, ":0", nil)
	w.crossing = serveRecorder(t, &recorder{name: "crossing"}, ":0", nil)
	w.upstream = serveRecorder(t, &recorder{name: "upstream"}, "127.0.0.3:0", nil)
	w.upstream.redirectTo = fmt.Sprintf("http://127.0.0.1:%d/atk/redirect-followed/", w.internal.port)
	w.provider = serveRecorder(t, &recorder{name: "provider", answer: attackModel(attackKey)}, "127.0.0.1:0", nil)
	w.secret = serveRecorder(t, &recorder{name: "secret"}, "127.0.0.1:0", &leaf)
	w.plainTLS = serveRecorder(t, &recorder{name: "plain-tls"}, "127.0.0.3:0", &leaf)
	w.all = []*recorder{w.internal, w.crossing, w.upstream, w.provider, w.secret, w.plainTLS}
	w.tmpSock = unixGreeter(t)

	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if ifc, err := net.InterfaceByName("docker0"); err == nil {
		if as, err := ifc.Addrs(); err == nil {
			for _, a := range as {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
					w.gateway = p.Addr().String()
				}
			}
		}
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().IsGlobalUnicast() || p.Addr().String() == w.gateway {
			continue
		}
		host := p.Addr().String()
		if p.Addr().Is6() {
			host = "[" + host + "]"
		} else if n := p.Masked().Addr().Next(); n != p.Addr() && p.Bits() < 31 && w.neighbor == "" {
			w.neighbor = n.String()
		}
		w.ownAddrs = append(w.ownAddrs, host)
	}
	return w
}

// reached names the upstreams that saw the marker of each of names.
func (w *attackWorld) reached(names ...string) []string {
	var out []string
	for _, rec := range w.all {
		for _, n := range names {
			if len(rec.requests(n)) > 0 {
				out = append(out, rec.name+" saw "+n)
			}
		}
	}
	return out
}

// describe says which upstream saw which request marked name.
func (w *attackWorld) describe(name string) string {
	var out []string
	for _, rec := range w.all {
		for _, r := range rec.requests(name) {
			out = append(out, fmt.Sprintf("%s got %s %s Host %s", rec.name, r.Method, r.URI, r.Host))
		}
	}
	if len(out) == 0 {
		return "none saw it"
	}
	return strings.Join(out, "; ")
}

// probeResult is what the probe reports for one case (its result type).
type probeResult struct {
	Name    string `json:"name"`
	Answers []struct {
		Status int    `json:"status"`
		Egress string `json:"egress"`
		Body   string `json:"body"`
	} `json:"answers"`
	Err       string  `json:"err"`
	TLSErr    string  `json:"tls_err"`
	TLSIssuer string  `json:"tls_issuer"`
	Held      int     `json:"held"`
	Greeting  string  `json:"greeting"`
	Seconds   float64 `json:"seconds"`
	CA        *struct {
		Subject       string   `json:"subject"`
		PermittedDNS  []string `json:"permitted_dns"`
		PermittedIPs  []string `json:"permitted_ips"`
		Critical      bool     `json:"critical"`
		LifetimeHours float64  `json:"lifetime_hours"`
	} `json:"ca"`
}

func (r probeResult) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// probeCase is one case as the probe reads it (its probeCase type).
type probeCase struct {
	Name      string `json:"name"`
	Phase     int    `json:"phase,omitempty"`
	Dial      string `json:"dial,omitempty"`
	Send      string `json:"send,omitempty"`
	Responses int    `json:"responses,omitempty"`
	Tunnel    bool   `json:"tunnel,omitempty"`
	TLSName   string `json:"tls_name,omitempty"`
	TLSRoots  string `json:"tls_roots,omitempty"`
	Inner     string `json:"inner,omitempty"`
	// InnerResponses answers are read inside the tunnel (default 1).
	InnerResponses int    `json:"inner_responses,omitempty"`
	Hold           int    `json:"hold,omitempty"`
	HoldAt         string `json:"hold_at,omitempty"`
	HoldSend       string `json:"hold_send,omitempty"`
	CAInfo         bool   `json:"ca_info,omitempty"`
	Greeting       bool   `json:"greeting,omitempty"`
}

// attackCase is a case, what berthctl egress explain is asked about it (if
// it can express it), and what must hold; check returns "" when it held.
type attackCase struct {
	probeCase
	explainMethod, explainURL string
	check                     func(w *attackWorld, r probeResult) string
}

// berthRefused says whether an answer is the proxy's refusal with its
// reason (the relay passes it on as it came).
func berthRefused(status int, egress, body string) bool {
	return status >= 400 && (egress == "refused" || strings.Contains(body, "berth egress refused"))
}

// wall: the proxy answered 403 with its reason and no upstream saw the
// marker of name or of also.
func wall(also ...string) func(w *attackWorld, r probeResult) string {
	return func(w *attackWorld, r probeResult) string {
		if got := w.reached(append([]string{r.Name}, also...)...); len(got) > 0 {
			return "GOT THROUGH: " + strings.Join(got, "; ")
		}
		if len(r.Answers) == 0 {
			return "no answer from the proxy (" + r.Err + "), want its 403"
		}
		a := r.Answers[0]
		// A name the proxy cannot resolve was never dialled either.
		unresolved := a.Status == 502 && strings.Contains(a.Body, "cannot resolve")
		if a.Status != 403 && !unresolved || !berthRefused(a.Status, a.Egress, a.Body) {
			return fmt.Sprintf("answer %d %q, want the proxy's 403 with its reason", a.Status, a.Body)
		}
		return ""
	}
}

// blocked: no upstream saw the marker of name or of also, and nothing
// came back as a success (a refusal, a 4xx or 5xx, or no answer at all).
func blocked(also ...string) func(w *attackWorld, r probeResult) string {
	return func(w *attackWorld, r probeResult) string {
		if got := w.reached(append([]string{r.Name}, also...)...); len(got) > 0 {
			return "GOT THROUGH: " + strings.Join(got, "; ")
		}
		for _, a := range r.Answers {
			if a.Status >= 200 && a.Status < 400 {
				return fmt.Sprintf("answered %d %q", a.Status, a.Body)
			}
		}
		return ""
	}
}

// smuggleBlocked: the first request of the connection may pass (it is
// allowed); what rode behind it reached nobody and got no success.
func smuggleBlocked(smuggled string) func(w *attackWorld, r probeResult) string {
	return func(w *attackWorld, r probeResult) string {
		if got := w.reached(smuggled); len(got) > 0 {
			return "GOT THROUGH: " + strings.Join(got, "; ")
		}
		for i, a := range r.Answers {
			if i > 0 && a.Status >= 200 && a.Status < 400 {
				return fmt.Sprintf("the request behind the first was answered %d %q", a.Status, a.Body)
			}
		}
		return ""
	}
}

// reaches: a control; rec saw the marker and the (last) answer was status.
func reaches(rec func(w *attackWorld) *recorder, status int) func(w *attackWorld, r probeResult) string {
	return func(w *attackWorld, r probeResult) string {
		if len(r.Answers) == 0 {
			return "no answer (" + r.Err + r.TLSErr + "), want it to reach its upstream"
		}
		if a := r.Answers[len(r.Answers)-1]; a.Status != status {
			return fmt.Sprintf("answer %d %q, want %d from the upstream", a.Status, a.Body, status)
		}
		if up := rec(w); len(up.requests(r.Name)) == 0 {
			return up.name + " never saw it"
		}
		return ""
	}
}

func both(checks ...func(w *attackWorld, r probeResult) string) func(w *attackWorld, r probeResult) string {
	return func(w *attackWorld, r probeResult) string {
		for _, c := range checks {
			if why := c(w, r); why != "" {
				return why
			}
		}
		return ""
	}
}

func internalOf(w *attackWorld) *recorder { return w.internal }
func upstreamOf(w *attackWorld) *recorder { return w.upstream }
func providerOf(w *attackWorld) *recorder { return w.provider }

// get is a proxy-form GET of base/atk/<name>/ (marked as case name).
func get(name, base, extra string) string {
	u := base + "/atk/" + name + "/"
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", u, hostOf(base), extra)
}

// hostOf is base's host:port as written (a zone stays percent-encoded).
func hostOf(base string) string {
	host, _, _ := strings.Cut(strings.TrimPrefix(base, "http://"), "/")
	return host
}

func viaRelay(name, send string, check func(w *attackWorld, r probeResult) string) attackCase {
	return attackCase{probeCase: probeCase{Name: name, Dial: relay, Send: send}, check: check}
}

// explained is c with the question berthctl egress explain is asked.
func explained(c attackCase, method, u string) attackCase {
	c.explainMethod, c.explainURL = method, u
	return c
}

// providerCall is a POST to the agent's provider through the in-sandbox
// proxy, at path, with body and extra header lines.
func providerCall(path, body, extra string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, extra, len(body), body)
}

func modelBody(name string) string {
	return `{"model":"gpt-e2e","attack":"` + name + `","messages":[{"role":"user","content":"hi"}]}`
}

// tunnelCase CONNECTs to target through the in-sandbox proxy, then speaks
// TLS (roots as the probe takes them, or "plain") and sends inner.
func tunnelCase(name, target, tlsName, roots, inner string) probeCase {
	return probeCase{Name: name, Dial: relay, Tunnel: true, TLSName: tlsName, TLSRoots: roots, Inner: inner,
		Send: fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)}
}

func innerGet(name, host string) string {
	return fmt.Sprintf("GET /atk/%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name, host)
}

// slotsFree: with 33 connections held, the authenticated request got
// through at once (the proxy's own timeouts would free a slot in 10 s or
// more: that is the wait the limit must not impose).
func slotsFree(w *attackWorld, r probeResult) string {
	if r.Held != 33 {
		return fmt.Sprintf("the probe held %d connections, want 33: %v", r.Held, r)
	}
	if why := reaches(upstreamOf, 200)(w, r); why != "" {
		return why
	}
	if r.Seconds > 5 {
		return fmt.Sprintf("the authenticated request waited %.1f s for a slot", r.Seconds)
	}
	return ""
}

// attackerCases are what the attacker agent tries. ownSocket is its run's
// socket as the sandbox sees it, otherSocket the concurrent control run's.
func attackerCases(w *attackWorld, container bool, ownSocket, otherSocket string) []attackCase {
	intPort, xPort, provPort := w.internal.port, w.crossing.port, w.provider.port
	up := fmt.Sprintf("http://127.0.0.3:%d", w.upstream.port)
	upHost := hostOf(up)
	var cs []attackCase

	// SSRF: "*:PORT" allows any host on the internal upstream's port, so
	// only the internal-address wall stands between the tool and the host.
	ssrf := map[string]string{
		"ssrf-127.0.0.1": "127.0.0.1", "ssrf-127.1": "127.1", "ssrf-0x7f.1": "0x7f.1",
		"ssrf-2130706433": "2130706433", "ssrf-0177.0.0.1": "0177.0.0.1", "ssrf-0x7f000001": "0x7f000001",
		"ssrf-127.9.9.9": "127.9.9.9", "ssrf-v6-loopback": "[::1]", "ssrf-v6-loopback-zone": "[::1%25lo]",
		"ssrf-v4-mapped": "[::ffff:127.0.0.1]", "ssrf-v4-mapped-hex": "[::ffff:7f00:1]",
		"ssrf-v4-compatible": "[::127.0.0.1]", "ssrf-nat64": "[64:ff9b::7f00:1]", "ssrf-nat64-local": "[64:ff9b:1::7f00:1]",
		"ssrf-6to4": "[2002:7f00:1::]", "ssrf-unspecified": "0.0.0.0", "ssrf-v6-unspecified": "[::]",
		"ssrf-localhost": "localhost", "ssrf-localhost-upper": "LOCALHOST", "ssrf-localhost-dot": "localhost.",
		"ssrf-metadata": "169.254.169.254", "ssrf-v6-link-local": "[fe80::1]",
		"ssrf-cgnat": "100.64.0.1", "ssrf-benchmark": "198.18.0.1", "ssrf-reserved": "240.0.0.1",
		"ssrf-broadcast": "255.255.255.255", "ssrf-multicast": "224.0.0.1", "ssrf-v6-multicast": "[ff02::1]",
		"ssrf-10": "10.0.0.1", "ssrf-192.168": "192.168.1.1", "ssrf-172.16": "172.16.0.1", "ssrf-ula": "[fd00::1]",
	}
	if w.gateway != "" {
		ssrf["ssrf-docker-gateway"] = w.gateway
	}
	for i, a := range w.ownAddrs {
		ssrf[fmt.Sprintf("ssrf-own-address-%d", i)] = a
	}
	if w.neighbor != "" {
		ssrf["ssrf-own-subnet"] = w.neighbor
	}
	for name, host := range ssrf {
		base := fmt.Sprintf("http://%s:%d", host, intPort)
		cs = append(cs, explained(viaRelay(name, get(name, base, ""), wall()), "GET", base+"/"))
	}
	cs = append(cs,
		explained(attackCase{probeCase: tunnelCase("connect-loopback", fmt.Sprintf("127.0.0.1:%d", intPort), "", "plain", innerGet("connect-loopback", "x")), check: wall()},
			"CONNECT", fmt.Sprintf("https://127.0.0.1:%d/", intPort)),
		explained(attackCase{probeCase: tunnelCase("connect-v6-loopback", fmt.Sprintf("[::1]:%d", intPort), "", "plain", innerGet("connect-v6-loopback", "x")), check: wall()},
			"CONNECT", fmt.Sprintf("https://[::1]:%d/", intPort)),
		explained(attackCase{probeCase: tunnelCase("connect-localhost", fmt.Sprintf("localhost:%d", intPort), "", "plain", innerGet("connect-localhost", "x")), check: wall()},
			"CONNECT", fmt.Sprintf("https://localhost:%d/", intPort)),
		// The client follows an allowed upstream's redirect to loopback: the
		// proxy passes the 302 on untouched, and the follow-up is refused.
		viaRelay("redirect", fmt.Sprintf("GET %s/atk/redirect/redirect HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", up, upHost),
			func(w *attackWorld, r probeResult) string {
				if got := w.internal.requests("redirect-followed"); len(got) > 0 {
					return "GOT THROUGH: the proxy followed the redirect to loopback"
				}
				if len(r.Answers) == 0 || r.Answers[0].Status != 302 {
					return fmt.Sprintf("want the upstream's 302 passed on: %v", r)
				}
				return ""
			}),
		explained(viaRelay("redirect-followed", get("redirect-followed", fmt.Sprintf("http://127.0.0.1:%d", intPort), ""), wall()),
			"GET", fmt.Sprintf("http://127.0.0.1:%d/atk/redirect-followed/", intPort)),
	)

	// Rules crossing: the method and port of "*:PORT" with the exact-name
	// exception of "GET,HEAD 127.0.0.2:XPORT".
	post := func(name, base, method string) string {
		return fmt.Sprintf("%s %s/atk/%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", method, base, name, hostOf(base))
	}
	crossInt := fmt.Sprintf("http://127.0.0.2:%d", intPort)
	crossX := fmt.Sprintf("http://127.0.0.2:%d", xPort)
	cs = append(cs,
		explained(viaRelay("crossing-post", post("crossing-post", crossInt, "POST"), wall()), "POST", crossInt+"/"),
		explained(viaRelay("crossing-get-other-port", get("crossing-get-other-port", crossInt, ""), wall()), "GET", crossInt+"/"),
		explained(viaRelay("crossing-post-named-port", post("crossing-post-named-port", crossX, "POST"), wall()), "POST", crossX+"/"),
		viaRelay("crossing-lowercase-post", post("crossing-lowercase-post", crossX, "post"), blocked()),
		viaRelay("crossing-unknown-method", post("crossing-unknown-method", crossX, "FOO"), blocked()),
		// The control: the rule's own method and port pass.
		explained(viaRelay("crossing-control", get("crossing-control", crossX, ""), reaches(func(w *attackWorld) *recorder { return w.crossing }, 200)), "GET", crossX+"/"),
	)

	// Provider connections: the first model call warmed the proxy's pool
	// to the provider's address; "*:PROVPORT" lets a tool name it.
	prov := fmt.Sprintf("http://127.0.0.1:%d", provPort)
	cs = append(cs,
		explained(viaRelay("provider-reuse", get("provider-reuse", prov, ""), wall()), "GET", prov+"/"),
		explained(viaRelay("provider-reuse-v1", get("provider-reuse-v1", prov+"/v1/chat/completions", ""), wall()), "GET", prov+"/v1/chat/completions"),
		explained(viaRelay("provider-reuse-other-name", get("provider-reuse-other-name", fmt.Sprintf("http://localhost:%d", provPort), ""), wall()),
			"GET", fmt.Sprintf("http://localhost:%d/", provPort)),
		explained(attackCase{probeCase: tunnelCase("provider-connect", fmt.Sprintf("127.0.0.1:%d", provPort), "", "plain", innerGet("provider-connect", "x")), check: wall()},
			"CONNECT", fmt.Sprintf("https://127.0.0.1:%d/", provPort)),
	)

	// The model check.
	completions := "/providers/gpt/chat/completions"
	for name, body := range map[string]string{
		"model-case-variant":     `{"model":"other","Model":"gpt-e2e","attack":"model-case-variant","messages":[]}`,
		"model-case-variant-2":   `{"MODEL":"gpt-e2e","model":"other","attack":"model-case-variant-2","messages":[]}`,
		"model-duplicate":        `{"model":"other","model":"gpt-e2e","attack":"model-duplicate","messages":[]}`,
		"model-escaped-key":      `{"mod\u0065l":"other","model":"gpt-e2e","attack":"model-escaped-key","messages":[]}`,
		"model-array":            `[{"model":"gpt-e2e","attack":"model-array","messages":[]}]`,
		"model-string":           `"{\"model\":\"gpt-e2e\",\"attack\":\"model-string\"}"`,
		"model-trailing-object":  `{"model":"gpt-e2e","attack":"model-trailing-object","messages":[]}{"model":"other"}`,
		"model-trailing-garbage": `{"model":"gpt-e2e","attack":"model-trailing-garbage","messages":[]} x`,
		"model-other":            `{"model":"other","attack":"model-other","messages":[]}`,
		"model-null":             `{"model":null,"attack":"model-null","messages":[]}`,
	} {
		cs = append(cs, viaRelay(name, providerCall(completions, body, ""), wall()))
	}
	cs = append(cs, viaRelay("model-control", providerCall(completions, modelBody("model-control"), ""), both(reaches(providerOf, 200),
		func(w *attackWorld, r probeResult) string {
			for _, got := range w.provider.requests(r.Name) {
				if got.Header.Get("Authorization") != "Bearer "+attackKey {
					return fmt.Sprintf("the provider got Authorization %q, want the proxy's key", got.Header.Get("Authorization"))
				}
			}
			return ""
		})))

	// The key only for the provider API's own endpoints, on the cleaned,
	// decoded path.
	for name, path := range map[string]string{
		"path-dotdot":         "/providers/gpt/../../atk/path-dotdot/",
		"path-dotdot-deep":    "/providers/gpt/chat/../../../atk/path-dotdot-deep/",
		"path-encoded-dots":   "/providers/gpt/%2e%2e/%2e%2e/atk/path-encoded-dots/",
		"path-encoded-slash":  "/providers/gpt/..%2f..%2fatk/path-encoded-slash/",
		"path-all-encoded":    "/providers/gpt/%2e%2e%2f%2e%2e%2fatk/path-all-encoded/",
		"path-double-encoded": "/providers/gpt/%252e%252e%252f%252e%252e%252fatk/path-double-encoded/",
		"path-other-endpoint": "/providers/gpt/atk/path-other-endpoint/",
		"path-double-slash":   "/providers/gpt//atk/path-double-slash/",
		"path-backslash":      "/providers/gpt/..\\..\\atk/path-backslash/",
	} {
		cs = append(cs, viaRelay(name, providerCall(path, modelBody(name), ""), wall()))
	}
	cs = append(cs,
		// The query string is dropped (or the call refused): it never
		// reaches the provider with the key.
		viaRelay("path-query", providerCall(completions+"?api-version=evil&atk=1", modelBody("path-query"), ""),
			func(w *attackWorld, r probeResult) string {
				for _, got := range w.provider.requests(r.Name) {
					if strings.Contains(got.URI, "?") {
						return "GOT THROUGH: the provider got the query string: " + got.URI
					}
				}
				return ""
			}),
		// Who pays is the admin's config, never the sandbox's headers.
		viaRelay("billing-headers", providerCall(completions, modelBody("billing-headers"),
			"OpenAI-Organization: org-sandbox\r\nOpenAI-Project: proj-sandbox\r\nAnthropic-Beta: sandbox-beta\r\nX-Api-Key: sk-sandbox\r\nAuthorization: Bearer sk-sandbox\r\nCookie: s=1\r\n"),
			func(w *attackWorld, r probeResult) string {
				for _, got := range w.provider.requests(r.Name) {
					for _, h := range []string{"OpenAI-Organization", "OpenAI-Project", "Anthropic-Beta", "X-Api-Key", "Cookie"} {
						if v := got.Header.Get(h); v != "" {
							return fmt.Sprintf("GOT THROUGH: the provider got %s: %s with the admin's key", h, v)
						}
					}
					if a := got.Header.Get("Authorization"); a != "Bearer "+attackKey {
						return fmt.Sprintf("the provider got Authorization %q", a)
					}
				}
				if len(r.Answers) == 0 {
					return "no answer: " + r.Err
				}
				return ""
			}),
	)

	// Forwarding: what the proxy sends upstream and where.
	cs = append(cs,
		viaRelay("proxy-authorization", get("proxy-authorization", up, "Proxy-Authorization: Bearer sandbox-made\r\n"),
			both(reaches(upstreamOf, 200), func(w *attackWorld, r probeResult) string {
				for _, got := range w.upstream.requests(r.Name) {
					if v := got.Header.Get("Proxy-Authorization"); v != "" {
						return "GOT THROUGH: the upstream got Proxy-Authorization " + v
					}
				}
				return ""
			})),
		viaRelay("host-mismatch", fmt.Sprintf("GET %s/atk/host-mismatch/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", up, intPort),
			func(w *attackWorld, r probeResult) string {
				if got := w.internal.requests(r.Name); len(got) > 0 {
					return "GOT THROUGH: the Host header routed it to the internal upstream"
				}
				for _, got := range w.upstream.requests(r.Name) {
					if got.Host != upHost {
						return fmt.Sprintf("the upstream got Host %q, not the host the proxy judged (%s)", got.Host, upHost)
					}
				}
				return ""
			}),
		viaRelay("host-mismatch-internal-url", fmt.Sprintf("GET http://127.0.0.1:%d/atk/host-mismatch-internal-url/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", intPort, upHost), wall()),
		viaRelay("origin-form-host", fmt.Sprintf("GET /atk/origin-form-host/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", intPort), blocked()),
		viaRelay("userinfo", fmt.Sprintf("GET http://%s@127.0.0.1:%d/atk/userinfo/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", upHost, intPort, intPort), blocked()),
		viaRelay("fragment-at", fmt.Sprintf("GET http://127.0.0.1:%d#@%s/atk/fragment-at/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", intPort, upHost, upHost),
			func(w *attackWorld, r probeResult) string {
				if got := w.internal.requests(r.Name); len(got) > 0 {
					return "GOT THROUGH: the internal upstream got it"
				}
				return ""
			}),
		viaRelay("backslash-at", fmt.Sprintf("GET http://%s\\@127.0.0.1:%d/atk/backslash-at/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", upHost, intPort, upHost),
			func(w *attackWorld, r probeResult) string {
				if got := w.internal.requests(r.Name); len(got) > 0 {
					return "GOT THROUGH: the internal upstream got it"
				}
				return ""
			}),
		viaRelay("https-absolute-form", fmt.Sprintf("GET https://127.0.0.1:%d/atk/https-absolute-form/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", intPort, intPort), blocked()),
		// The tunnel's target and its Host header disagree.
		explained(attackCase{probeCase: probeCase{Name: "connect-host-mismatch", Dial: relay, Tunnel: true, TLSRoots: "plain", Inner: innerGet("connect-host-mismatch", "x"),
			Send: fmt.Sprintf("CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: %s\r\n\r\n", intPort, upHost)}, check: wall()},
			"CONNECT", fmt.Sprintf("https://127.0.0.1:%d/", intPort)),
		// A provider path in absolute form is a request to a host named
		// "egress", not a provider call.
		viaRelay("provider-absolute-form", strings.Replace(providerCall("http://egress"+completions, modelBody("provider-absolute-form"), ""), "Host: 127.0.0.1:3128", "Host: egress", 1), blocked()),
		viaRelay("long-host-name", get("long-host-name", fmt.Sprintf("http://%s.example:%d", strings.Repeat("a", 300), intPort), ""), both(blocked(),
			func(w *attackWorld, r probeResult) string {
				if len(r.Answers) == 0 || !berthRefused(r.Answers[0].Status, r.Answers[0].Egress, r.Answers[0].Body) {
					return fmt.Sprintf("want the proxy's refusal: %v", r)
				}
				return ""
			})),
		viaRelay("http2-prior-knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", blocked()),
	)

	// Smuggling and pipelining through the in-sandbox proxy and the
	// egress proxy: every request is judged, none rides in another's body.
	smuggled := func(name string) string {
		return fmt.Sprintf("GET http://127.0.0.1:%d/atk/%s/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", intPort, name, intPort)
	}
	clte := "0\r\n\r\n" + smuggled("cl-te-smuggled")
	tecl := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(smuggled("te-cl-smuggled")), smuggled("te-cl-smuggled"))
	cs = append(cs,
		attackCase{probeCase: probeCase{Name: "cl-te", Dial: relay, Responses: 2, Send: fmt.Sprintf(
			"POST %s/atk/cl-te/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%s", up, upHost, clte)},
			check: smuggleBlocked("cl-te-smuggled")},
		attackCase{probeCase: probeCase{Name: "te-cl", Dial: relay, Responses: 2, Send: fmt.Sprintf(
			"POST %s/atk/te-cl/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n%s", up, upHost, tecl)},
			check: smuggleBlocked("te-cl-smuggled")},
		attackCase{probeCase: probeCase{Name: "te-obfuscated", Dial: relay, Responses: 2, Send: fmt.Sprintf(
			"POST %s/atk/te-obfuscated/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n%s", up, upHost, smuggled("te-obfuscated-smuggled"))},
			check: smuggleBlocked("te-obfuscated-smuggled")},
		attackCase{probeCase: probeCase{Name: "double-content-length", Dial: relay, Responses: 2, Send: fmt.Sprintf(
			"POST %s/atk/double-content-length/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n%s", up, upHost, len(smuggled("double-cl-smuggled")), smuggled("double-cl-smuggled"))},
			check: smuggleBlocked("double-cl-smuggled")},
		attackCase{probeCase: probeCase{Name: "expect-continue", Dial: relay, Responses: 2, Send: fmt.Sprintf(
			"POST http://127.0.0.1:%d/atk/expect-continue/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s", intPort, intPort, len(smuggled("expect-smuggled")), smuggled("expect-smuggled"))},
			check: blocked("expect-smuggled")},
		attackCase{probeCase: probeCase{Name: "pipeline", Dial: relay, Responses: 3, Send: fmt.Sprintf(
			"GET %s/atk/pipeline/ HTTP/1.1\r\nHost: %s\r\n\r\n%sGET %s/atk/pipeline-3/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
			up, upHost, smuggled("pipeline-smuggled"), up, upHost)},
			check: func(w *attackWorld, r probeResult) string {
				if got := w.reached("pipeline-smuggled"); len(got) > 0 {
					return "GOT THROUGH: " + strings.Join(got, "; ")
				}
				var st []int
				for _, a := range r.Answers {
					st = append(st, a.Status)
				}
				if fmt.Sprint(st) != "[200 403 200]" {
					return fmt.Sprintf("statuses %v, want [200 403 200] (each pipelined request judged on its own): %v", st, r)
				}
				return ""
			}},
		// Header bounds: the README's 16 KiB exactly.
		viaRelay("header-18k", get("header-18k", up, "X-Pad: "+strings.Repeat("a", 18<<10)+"\r\n"), blocked()),
		viaRelay("header-15k", get("header-15k", up, "X-Pad: "+strings.Repeat("a", 15<<10)+"\r\n"), reaches(upstreamOf, 200)),
	)

	// The run's socket: without the token nothing passes; another run's
	// socket and a guessed token neither.
	guessed := "Proxy-Authorization: Bearer " + strings.Repeat("0", 64) + "\r\n"
	cs = append(cs,
		attackCase{probeCase: probeCase{Name: "socket-no-token", Dial: "unix:" + ownSocket, Send: get("socket-no-token", up, "")}, check: func(w *attackWorld, r probeResult) string {
			if why := blocked()(w, r); why != "" {
				return why
			}
			if len(r.Answers) == 0 || r.Answers[0].Status != 407 {
				return fmt.Sprintf("want the proxy's 407: %v", r)
			}
			return ""
		}},
		// The provider key is spent only for the token's holder.
		attackCase{probeCase: probeCase{Name: "socket-provider-no-token", Dial: "unix:" + ownSocket,
			Send: strings.Replace(providerCall(completions, modelBody("socket-provider-no-token"), ""), "Host: 127.0.0.1:3128", "Host: egress", 1)}, check: blocked()},
		attackCase{probeCase: probeCase{Name: "socket-guessed-token", Dial: "unix:" + ownSocket, Send: get("socket-guessed-token", up, guessed)}, check: blocked()},
		attackCase{probeCase: probeCase{Name: "other-run-socket", Dial: "unix:" + otherSocket, Send: get("other-run-socket", up, "")}, check: blocked()},
		attackCase{probeCase: probeCase{Name: "other-run-socket-guessed-token", Dial: "unix:" + otherSocket, Send: get("other-run-socket-guessed-token", up, guessed)}, check: blocked()},
		// 33 connections that never authenticate hold no slot an
		// authenticated request needs (a CONNECT dials the socket anew).
		attackCase{probeCase: func() probeCase {
			c := tunnelCase("unauthenticated-connections", upHost, "", "plain", innerGet("unauthenticated-connections", upHost))
			c.Phase, c.Hold, c.HoldAt = 1, 33, "unix:"+ownSocket
			return c
		}(), check: slotsFree},
		// The same with connections that each sent a request without the
		// token and keep alive after its 407.
		attackCase{probeCase: func() probeCase {
			c := tunnelCase("unauthenticated-requests", upHost, "", "plain", innerGet("unauthenticated-requests", upHost))
			c.Phase, c.Hold, c.HoldAt = 2, 33, "unix:"+ownSocket
			c.HoldSend = fmt.Sprintf("GET %s/ HTTP/1.1\r\nHost: %s\r\n\r\n", up, upHost)
			return c
		}(), check: slotsFree},
	)

	// [[egress.secrets]]: the secret goes to its host only, inside a tunnel
	// whose requests all name that host.
	secretHost := fmt.Sprintf("%s:%d", secretName, w.secret.port)
	plainTLSHost := fmt.Sprintf("127.0.0.3:%d", w.plainTLS.port)
	secretWith := func(name string, want bool) func(w *attackWorld, r probeResult) string {
		return func(w *attackWorld, r probeResult) string {
			got := w.secret.requests(name)
			if want && len(got) == 0 {
				return fmt.Sprintf("the secret's host never saw it: %v", r)
			}
			for _, g := range got {
				if want && g.Header.Get("Authorization") != "Bearer "+attackSecret {
					return fmt.Sprintf("the secret's host got Authorization %q, want the secret", g.Header.Get("Authorization"))
				}
				if !want {
					return fmt.Sprintf("GOT THROUGH: the secret's front end got Host %q with Authorization %q", g.Host, g.Header.Get("Authorization"))
				}
			}
			return ""
		}
	}
	withoutSecret := func(w *attackWorld, r probeResult) string {
		for _, g := range w.secret.requests(r.Name) {
			if strings.Contains(fmt.Sprint(g.Header), attackSecret) {
				return fmt.Sprintf("GOT THROUGH: %s %s, outside the secret's scope, carried it", g.Method, g.URI)
			}
		}
		return ""
	}
	cs = append(cs,
		explained(attackCase{probeCase: tunnelCase("secret-control", secretHost, secretName, "bundle", innerGet("secret-control", secretHost)), check: secretWith("secret-control", true)},
			"CONNECT", "https://"+secretHost+"/"),
		attackCase{probeCase: tunnelCase("secret-fronting", secretHost, secretName, "bundle", innerGet("secret-fronting", "other.example")),
			check: both(secretWith("secret-fronting", false), func(w *attackWorld, r probeResult) string {
				if len(r.Answers) < 2 || !berthRefused(r.Answers[1].Status, r.Answers[1].Egress, r.Answers[1].Body) {
					return fmt.Sprintf("want the proxy's refusal inside the tunnel: %v", r)
				}
				return ""
			})},
		attackCase{probeCase: tunnelCase("secret-fronting-absolute", secretHost, secretName, "bundle",
			fmt.Sprintf("GET https://other.example/atk/secret-fronting-absolute/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", secretHost)),
			check: secretWith("secret-fronting-absolute", false)},
		attackCase{probeCase: tunnelCase("secret-fronting-other-port", secretHost, secretName, "bundle",
			"GET https://"+secretName+":1/atk/secret-fronting-other-port/ HTTP/1.1\r\nHost: "+secretName+":1\r\nConnection: close\r\n\r\n"),
			check: secretWith("secret-fronting-other-port", false)},
		// The first request in the tunnel names its host; the one behind it
		// fronts another and is refused on its own.
		attackCase{probeCase: func() probeCase {
			c := tunnelCase("secret-fronting-pipelined", secretHost, secretName, "bundle",
				fmt.Sprintf("GET /atk/secret-fronting-pipelined-first/ HTTP/1.1\r\nHost: %s\r\n\r\n", secretHost)+innerGet("secret-fronting-pipelined", "other.example"))
			c.InnerResponses = 2
			return c
		}(), check: both(secretWith("secret-fronting-pipelined", false), secretWith("secret-fronting-pipelined-first", true))},
		attackCase{probeCase: tunnelCase("secret-header-18k", secretHost, secretName, "bundle",
			fmt.Sprintf("GET /atk/secret-header-18k/ HTTP/1.1\r\nHost: %s\r\nX-Pad: %s\r\nConnection: close\r\n\r\n", secretHost, strings.Repeat("a", 18<<10))),
			check: func(w *attackWorld, r probeResult) string {
				if got := w.reached(r.Name); len(got) > 0 {
					return "GOT THROUGH: an 18 KiB header reached the secret's host: " + strings.Join(got, "; ")
				}
				return ""
			}},
		// Outside its scope (GET under /atk, on a plain path) a request goes
		// without the secret.
		attackCase{probeCase: tunnelCase("secret-scope-method", secretHost, secretName, "bundle",
			fmt.Sprintf("POST /atk/secret-scope-method/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", secretHost)),
			check: withoutSecret},
		attackCase{probeCase: tunnelCase("secret-scope-path", secretHost, secretName, "bundle",
			fmt.Sprintf("GET /atkx/atk/secret-scope-path/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", secretHost)),
			check: withoutSecret},
		attackCase{probeCase: tunnelCase("secret-scope-dot-segments", secretHost, secretName, "bundle",
			fmt.Sprintf("GET /atk/../x/atk/secret-scope-dot-segments/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", secretHost)),
			check: withoutSecret},
		attackCase{probeCase: tunnelCase("secret-scope-encoded-slash", secretHost, secretName, "bundle",
			fmt.Sprintf("GET /atk%%2f..%%2fx/atk/secret-scope-encoded-slash/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", secretHost)),
			check: withoutSecret},
		attackCase{probeCase: tunnelCase("secret-not-for-other-hosts", plainTLSHost, secretName, "none", innerGet("secret-not-for-other-hosts", plainTLSHost)),
			check: both(reaches(func(w *attackWorld) *recorder { return w.plainTLS }, 200), func(w *attackWorld, r probeResult) string {
				for _, g := range w.plainTLS.requests(r.Name) {
					if strings.Contains(fmt.Sprint(g.Header), attackSecret) {
						return "GOT THROUGH: a host that is not the secret's got the secret"
					}
				}
				if strings.HasPrefix(r.TLSIssuer, "berth egress CA") {
					return "the proxy intercepted a host no secret names"
				}
				return ""
			})},
		// The run's CA vouches for the intercepted hosts only, for the run.
		attackCase{probeCase: tunnelCase("run-ca-secret-host", secretHost, secretName, "run-ca", innerGet("run-ca-secret-host", secretHost)), check: secretWith("run-ca-secret-host", true)},
		attackCase{probeCase: tunnelCase("run-ca-other-host", plainTLSHost, secretName, "run-ca", innerGet("run-ca-other-host", plainTLSHost)),
			check: func(w *attackWorld, r probeResult) string {
				if r.TLSErr == "" {
					return fmt.Sprintf("the run's CA verified a host it does not intercept: %v", r)
				}
				if got := w.reached(r.Name); len(got) > 0 {
					return "GOT THROUGH: " + strings.Join(got, "; ")
				}
				return ""
			}},
		attackCase{probeCase: probeCase{Name: "run-ca-constraints", CAInfo: true}, check: func(w *attackWorld, r probeResult) string {
			if r.CA == nil {
				return "cannot read the run's CA bundle in the sandbox: " + r.Err
			}
			if !strings.HasPrefix(r.CA.Subject, "berth egress CA") {
				return fmt.Sprintf("the bundle's last certificate is %q, not the run's CA", r.CA.Subject)
			}
			if fmt.Sprint(r.CA.PermittedDNS) != "["+secretName+"]" {
				return fmt.Sprintf("the run's CA may vouch for names %v (addresses %v), want exactly the intercepted host %s", r.CA.PermittedDNS, r.CA.PermittedIPs, secretName)
			}
			if r.CA.LifetimeHours > 1 {
				return fmt.Sprintf("the run's CA lives %.1f hours, want about the run's lifetime", r.CA.LifetimeHours)
			}
			return ""
		}},
	)
	if !container {
		// A host run with a private /tmp cannot reach a socket the host
		// keeps there (Landlock does not govern connect()).
		cs = append(cs, attackCase{probeCase: probeCase{Name: "tmp-unix-socket", Dial: "unix:" + w.tmpSock, Greeting: true},
			check: func(w *attackWorld, r probeResult) string {
				if r.Greeting != "" {
					return "GOT THROUGH: the run connected to " + w.tmpSock + ": " + r.Greeting
				}
				return ""
			}})
	}
	return cs
}

// controlCases are the controls: the same targets, named exactly by the
// control agent's rules, get through.
func controlCases(w *attackWorld) []attackCase {
	var cs []attackCase
	targets := map[string]string{"control-127.0.0.1": "127.0.0.1", "control-localhost": "localhost", "control-v6-loopback": "[::1]", "control-unspecified": "0.0.0.0"}
	if w.gateway != "" {
		targets["control-docker-gateway"] = w.gateway
	}
	for i, a := range w.ownAddrs {
		targets[fmt.Sprintf("control-own-address-%d", i)] = a
	}
	for name, host := range targets {
		base := fmt.Sprintf("http://%s:%d", host, w.internal.port)
		cs = append(cs, explained(viaRelay(name, get(name, base, ""), reaches(internalOf, 200)), "GET", base+"/"))
	}
	crossInt := fmt.Sprintf("http://127.0.0.2:%d", w.internal.port)
	prov := fmt.Sprintf("http://127.0.0.1:%d", w.provider.port)
	cs = append(cs,
		explained(viaRelay("control-crossing-post", fmt.Sprintf("POST %s/atk/control-crossing-post/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", crossInt, hostOf(crossInt)),
			reaches(internalOf, 200)), "POST", crossInt+"/"),
		explained(viaRelay("control-provider-host", get("control-provider-host", prov, ""), reaches(providerOf, 200)), "GET", prov+"/"),
	)
	return cs
}

func controlRules(w *attackWorld) []string {
	rules := []string{
		fmt.Sprintf("127.0.0.1:%d", w.internal.port), fmt.Sprintf("localhost:%d", w.internal.port),
		fmt.Sprintf("[::1]:%d", w.internal.port), fmt.Sprintf("0.0.0.0:%d", w.internal.port),
		fmt.Sprintf("POST 127.0.0.2:%d", w.internal.port), fmt.Sprintf("127.0.0.1:%d", w.provider.port),
	}
	if w.gateway != "" {
		rules = append(rules, fmt.Sprintf("%s:%d", w.gateway, w.internal.port))
	}
	for _, a := range w.ownAddrs {
		rules = append(rules, fmt.Sprintf("%s:%d", a, w.internal.port))
	}
	return rules
}

func attackerRules(w *attackWorld) []string {
	return []string{
		fmt.Sprintf("*:%d", w.internal.port),
		fmt.Sprintf("GET,HEAD 127.0.0.2:%d", w.crossing.port),
		fmt.Sprintf("*:%d", w.provider.port),
		fmt.Sprintf("127.0.0.3:%d", w.upstream.port),
		fmt.Sprintf("%s:%d", secretName, w.secret.port),
		fmt.Sprintf("127.0.0.3:%d", w.plainTLS.port),
	}
}

func tomlList(items []string) string {
	b, _ := json.Marshal(items) // a JSON list of strings is a TOML array
	return string(b)
}

func TestEgressAttackOnHostRuns(t *testing.T) {
	t.Parallel()
	runEgressAttacks(t, false)
}

func TestEgressAttackOnContainerRuns(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	runEgressAttacks(t, true)
}

// runEgressAttacks starts one suite for the backend, runs the attacker, the
// control (concurrently: the attacker aims at its socket too) and, on the
// host, an unrestricted run as the /tmp control; then judges every case
// and asks berthctl egress explain about each one it can express.
func runEgressAttacks(t *testing.T, container bool) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	attackProbe.once.Do(func() {
		attackProbe.path, attackProbe.err = testenv.BuildStatic(binDir, probeName, "./testdata/egress_attack_probe")
	})
	if attackProbe.err != nil {
		t.Fatal(attackProbe.err)
	}
	w := newAttackWorld(t)
	box := ""
	if container {
		box = "[agents.container_mode]\nenabled = true\nnetwork = \"none\"\ntimeout_seconds = 300\n"
	}
	sink := newReplySink(t)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, `[providers]
primary = "gpt"

[providers.gpt]
kind = "openai"
base_url = "http://127.0.0.1:%d/v1"
api_key_env = "E2E_ATTACK_KEY"
model = "gpt-e2e"

[agent_defaults]
workspace_quota = "64m"

[[egress.secrets]]
name = "upstream-token"
env = "E2E_ATTACK_SECRET"
hosts = [%q]
ports = [%d]
methods = ["GET"]
paths = ["/atk"]

[[agents]]
id = "attack"
max_iterations = 4
[agents.egress]
allow = %s
%s
[[agents]]
id = "control"
max_iterations = 4
[agents.egress]
allow = %s
%s
`, w.provider.port, secretName, w.secret.port, tomlList(attackerRules(w)), box, tomlList(controlRules(w)), box)
	agents := []string{"attack", "control"}
	if !container {
		agents = append(agents, "free")
		cfg.WriteString("[[agents]]\nid = \"free\"\nmax_iterations = 4\n[agents.file_access]\nunrestricted = true\nallow_network = true\n\n")
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = \"attack\"\n\n[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, sink.srv.URL+"/replies")
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = %q\nagent = %q\n\n", a, a)
	}
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = 4\ndefault_timeout_seconds = 300\nrun_as = \"nobody\"\negress_user = \"daemon\"\nagent_binary = %q\n", filepath.Join(binDir, "berth-agent"))
	env := []string{"E2E_ATTACK_KEY=" + attackKey, "E2E_ATTACK_SECRET=" + attackSecret, "SSL_CERT_FILE=" + w.caFile}
	s := launchShort(t, sink, cfg.String(), env, attackKey, attackSecret)

	// A first run makes each workspace; then the probe goes into it.
	ask := func(agent, text string) string { return s.mustPost(t, agent, text) }
	waitOK := func(id string, timeout time.Duration) map[string]any {
		reply := s.sink.wait(t, timeout, id)[id]
		if reply["state"] != "succeeded" {
			t.Fatalf("run for %s: state %v, error %v, reply %q", id, reply["state"], reply["error"], text(reply))
		}
		return reply
	}
	warm := map[string]string{}
	for _, a := range agents {
		warm[a] = ask(a, "run echo workspace ready")
	}
	probeBin, err := os.ReadFile(attackProbe.path)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		waitOK(warm[a], 5*time.Minute)
		if err := os.WriteFile(s.workspace(a, probeName), probeBin, 0o755); err != nil {
			t.Fatalf("cannot put the probe into %s's workspace: %v", a, err)
		}
		os.Remove(s.workspace(a, "attack-results.json"))
	}

	msgs, runs, sockets := map[string]string{}, map[string]string{}, map[string]string{}
	for _, a := range agents {
		msgs[a] = ask(a, "run ./"+probeName)
	}
	for _, a := range agents {
		runs[a] = s.runIDOf(t, msgs[a])
		if a != "free" {
			sockets[a] = s.egressSocket(t, runs[a])
		}
	}
	own := sockets["attack"]
	if container {
		own = "/run/berth-egress/egress.sock"
	}
	cases := map[string][]attackCase{
		"attack":  attackerCases(w, container, own, sockets["control"]),
		"control": controlCases(w),
	}
	if !container {
		cases["free"] = []attackCase{{probeCase: probeCase{Name: "control-tmp-unix-socket", Dial: "unix:" + w.tmpSock, Greeting: true},
			check: func(w *attackWorld, r probeResult) string {
				if !strings.HasPrefix(r.Greeting, "hello") {
					return fmt.Sprintf("an unrestricted run cannot connect to %s either: %v", w.tmpSock, r)
				}
				return ""
			}}}
	}
	for a, list := range cases {
		var p struct {
			Cases   []probeCase `json:"cases"`
			Release string      `json:"release,omitempty"`
		}
		for _, c := range list {
			p.Cases = append(p.Cases, c.probeCase)
		}
		if a == "control" {
			p.Release = "attack-release"
		}
		b, _ := json.Marshal(p)
		if err := os.WriteFile(s.workspace(a, "attack-plan.json.tmp"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(s.workspace(a, "attack-plan.json.tmp"), s.workspace(a, "attack-plan.json")); err != nil {
			t.Fatal(err)
		}
	}
	// The control run stays in flight until the attacker is done with its
	// socket.
	waitOK(msgs["attack"], 6*time.Minute)
	os.WriteFile(s.workspace("control", "attack-release"), nil, 0o644)
	for _, a := range agents {
		waitOK(msgs[a], 6*time.Minute)
	}

	for _, a := range agents {
		b, err := os.ReadFile(s.workspace(a, "attack-results.json"))
		if err != nil {
			t.Fatalf("the probe of %s left no results: %v", a, err)
		}
		var results []probeResult
		if err := json.Unmarshal(b, &results); err != nil {
			t.Fatalf("the probe of %s left results that are not JSON: %v", a, err)
		}
		byName := map[string]probeResult{}
		for _, r := range results {
			byName[r.Name] = r
		}
		t.Run(a, func(t *testing.T) {
			for _, c := range cases[a] {
				t.Run(c.Name, func(t *testing.T) {
					r, ok := byName[c.Name]
					if !ok {
						t.Fatal("the probe did not run it")
					}
					if why := c.check(w, r); why != "" {
						t.Errorf("%s\nprobe: %v\nupstreams: %s", why, r, w.describe(c.Name))
					}
				})
			}
		})
		// berthctl egress explain must say what the proxy did.
		t.Run("explain-"+a, func(t *testing.T) {
			for _, c := range cases[a] {
				if c.explainURL == "" {
					continue
				}
				t.Run(c.Name, func(t *testing.T) {
					r := byName[c.Name]
					if len(r.Answers) == 0 {
						t.Fatalf("the proxy gave no answer to compare with (%s)", r.Err)
					}
					proxyAllowed := !berthRefused(r.Answers[0].Status, r.Answers[0].Egress, r.Answers[0].Body) || r.Answers[0].Status == 502
					out, _ := s.berthctl(t, "egress", "explain", "--json", "--method", c.explainMethod, a, c.explainURL)
					var v busapi.EgressVerdict
					// The verdict, then (on stderr, here in the same output) why
					// berthctl exits 1.
					if err := json.NewDecoder(strings.NewReader(out)).Decode(&v); err != nil {
						t.Fatalf("berthctl egress explain %s %s: not a verdict: %s", c.explainMethod, c.explainURL, out)
					}
					if v.Allowed != proxyAllowed {
						t.Errorf("berthctl egress explain %s %s says allowed=%v (%s; %s), the proxy answered %d %q",
							c.explainMethod, c.explainURL, v.Allowed, v.Reason, v.Note, r.Answers[0].Status, r.Answers[0].Body)
					}
				})
			}
		})
	}

	// Whatever any case did: the secret reached its host only, and no
	// upstream ever saw the run's token.
	for _, rec := range w.all {
		for _, got := range rec.all() {
			if rec != w.secret && strings.Contains(fmt.Sprint(got.Header)+got.URI+got.Body, attackSecret) {
				t.Errorf("GOT THROUGH: %s got the secret: %s %s", rec.name, got.Method, got.URI)
			}
			if v := got.Header.Get("Proxy-Authorization"); v != "" {
				t.Errorf("GOT THROUGH: %s got Proxy-Authorization %q (%s %s)", rec.name, v, got.Method, got.URI)
			}
		}
	}
	s.noKeyInRuns(t, attackKey, attackSecret)
}

// egressSocket waits for the socket of the run's attempt
// (<state>/scheduler/egress/<run id>-<attempt>/egress.sock) and returns it.
func (s *suite) egressSocket(t *testing.T, runID string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		found, _ := filepath.Glob(filepath.Join(s.StateDir, "scheduler", "egress", runID+"*", "egress.sock"))
		if len(found) == 1 {
			return found[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s has no egress socket after a minute: %v", runID, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
