package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

func rules(t *testing.T, ss ...string) []egresspolicy.Rule {
	t.Helper()
	var out []egresspolicy.Rule
	for _, s := range ss {
		r, err := egresspolicy.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// recordingUpstream is a plain HTTP upstream that remembers what reached it.
type recordingUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newRecordingUpstream(t *testing.T, h http.HandlerFunc) *recordingUpstream {
	u := &recordingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.reqs = append(u.reqs, r.Clone(context.Background()))
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, "upstream "+r.Method+" "+r.URL.RequestURI())
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *recordingUpstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

func (u *recordingUpstream) port() string {
	_, p, _ := net.SplitHostPort(u.Listener.Addr().String())
	return p
}

// A tool cannot ride the provider's warm keep-alive connection: each
// forwarded request is judged (rule, then the address) before it is sent.
func TestAToolCannotReachTheProvidersAddressOverItsPooledConnection(t *testing.T) {
	t.Parallel()
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	})
	pol := egress.Policy{RunID: "r1", Allow: rules(t, "*:"+model.port()),
		Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: openKey}}}
	p := startProxy(t, pol, egress.Options{})
	if code, body := do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("the provider call: %d %q", code, body)
	}
	code, body := do(t, p.client(token), "GET", model.URL+"/anything", "")
	if code != http.StatusForbidden || !strings.Contains(body, "a loopback address") {
		t.Fatalf("a tool's GET to the provider's address: %d %q, want 403 (loopback, no rule names it)", code, body)
	}
	if n := len(model.requests()); n != 1 {
		t.Fatalf("the provider saw %d requests, want only the provider call", n)
	}
}

// Host, port, method and the internal-address exception come from one
// rule: a rule naming the host on another port and method lends nothing.
func TestRulesNeverCrossOver(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t, nil)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, "GET,HEAD mirror.test:8080", "*:"+up.port())},
		egress.Options{Resolver: resolver{"mirror.test": "127.0.0.1"}})
	code, body := do(t, p.client(token), "POST", "http://mirror.test:"+up.port()+"/x", "data")
	if code != http.StatusForbidden || !strings.Contains(body, "only a rule naming mirror.test exactly allows that") {
		t.Fatalf("POST mirror.test:%s (internal) under *:%s: %d %q, want 403", up.port(), up.port(), code, body)
	}
	if len(up.requests()) != 0 {
		t.Fatal("the request reached the internal address")
	}
}

// recordingResolver remembers each name it was asked for.
type recordingResolver struct {
	resolver
	mu    sync.Mutex
	asked []string
}

func (r *recordingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.asked = append(r.asked, host)
	r.mu.Unlock()
	return r.resolver.LookupNetIP(ctx, network, host)
}

// A name no rule could allow is never looked up: the proxy's resolver is
// no side channel.
func TestANameNoRuleAllowsIsNeverResolved(t *testing.T) {
	t.Parallel()
	res := &recordingResolver{resolver: resolver{"files.test": "203.0.113.9"}}
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, "GET files.test:8080")}, egress.Options{Resolver: res})
	for _, tt := range []struct{ method, url string }{
		{"GET", "http://secret-data.exfil.example/"},
		{"POST", "http://files.test:8080/"},
		{"GET", "http://files.test:8081/"},
	} {
		if code, body := do(t, p.client(token), tt.method, tt.url, ""); code != http.StatusForbidden || !strings.Contains(body, "no [agents.egress] allow rule") {
			t.Fatalf("%s %s: %d %q", tt.method, tt.url, code, body)
		}
	}
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT tunnel.exfil.example:443 HTTP/1.1\r\nHost: tunnel.exfil.example:443\r\nProxy-Authorization: Bearer %s\r\n\r\n", token)
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT to a name no rule allows: %v %v", resp, err)
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if len(res.asked) != 0 {
		t.Fatalf("the proxy resolved %q, which no rule could allow", res.asked)
	}
}

// The model check reads the body as strictly as any provider could: one
// JSON object, no key twice, no case variant of "model".
func TestTheModelCheckCannotBeFooled(t *testing.T) {
	t.Parallel()
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "allowed", Key: openKey}}}, egress.Options{})
	tests := []struct {
		name, body, want string
		code             int
	}{
		{"a_case_variant_after_the_real_key", `{"model":"other","Model":"allowed"}`, `"Model", a case variant`, 403},
		{"a_case_variant_before_the_real_key", `{"MODEL":"other","model":"allowed"}`, `"MODEL", a case variant`, 403},
		{"a_duplicate_key", `{"model":"allowed","model":"other"}`, `the key "model" twice`, 403},
		{"a_duplicate_other_key", `{"model":"allowed","messages":[],"messages":[]}`, `the key "messages" twice`, 403},
		{"a_second_JSON_value", `{"model":"allowed"}{"model":"other"}`, "more than one JSON value", 403},
		{"an_array", `[{"model":"allowed"}]`, "not a JSON object", 403},
		{"a_model_that_is_not_a_string", `{"model":["allowed"]}`, "not a string", 403},
		{"nested_objects_may_hold_any_keys", `{"model":"allowed","metadata":{"Model":"x","model":"y"}}`, "{}", 200},
		{"the_agents_model_passes", `{"model":"allowed","messages":[]}`, "{}", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", tt.body)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tt.code, tt.want)
			}
		})
	}
	if n := len(model.requests()); n != 2 {
		t.Fatalf("the provider saw %d calls, want the 2 allowed", n)
	}
}

// The key goes only to the provider's API endpoints, named plainly under
// its base URL; a query string never follows.
func TestTheKeyGoesOnlyToTheProvidersEndpoints(t *testing.T) {
	t.Parallel()
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "path="+r.URL.RequestURI()) })
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{
		{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: openKey},
		{Name: "claude", Kind: "anthropic", BaseURL: model.URL, Model: "m", Key: claudKey},
		{Name: "custom", Kind: "openai", BaseURL: model.URL + "/api", Model: "m", Key: openKey, Endpoints: []string{"chat/completions"}},
	}}, egress.Options{})
	tests := []struct {
		name, method, path, want string
		code                     int
	}{
		{"chat_completions", "POST", "/providers/openai/chat/completions", "path=/v1/chat/completions", 200},
		{"responses", "POST", "/providers/openai/responses", "path=/v1/responses", 200},
		{"embeddings", "POST", "/providers/openai/embeddings", "path=/v1/embeddings", 200},
		{"models_with_GET", "GET", "/providers/openai/models", "path=/v1/models", 200},
		{"anthropic_messages", "POST", "/providers/claude/v1/messages", "path=/v1/messages", 200},
		{"anthropic_count_tokens", "POST", "/providers/claude/v1/messages/count_tokens", "path=/v1/messages/count_tokens", 200},
		{"a_query_string_is_dropped", "POST", "/providers/openai/chat/completions?redirect=http://evil", "path=/v1/chat/completions", 200},
		{"dot_dot_segments", "POST", "/providers/openai/../../anything", "not a plain API path", 403},
		{"encoded_dot_dot_slash", "POST", "/providers/openai/%2e%2e%2f%2e%2e%2fanything", "not a plain API path", 403},
		{"an_encoded_slash", "POST", "/providers/openai/chat%2fcompletions", "not a plain API path", 403},
		{"double_encoding", "POST", "/providers/openai/%252e%252e/anything", "not a plain API path", 403},
		{"an_empty_segment", "POST", "/providers/openai//chat/completions", "not a plain API path", 403},
		{"a_trailing_slash", "POST", "/providers/openai/chat/completions/", "not a plain API path", 403},
		{"trailing_junk", "POST", "/providers/openai/chat/completions/x", "not one of its API endpoints", 403},
		{"another_path_on_the_host", "POST", "/providers/openai/files", "not one of its API endpoints", 403},
		{"an_endpoint_the_config_does_not_list", "POST", "/providers/custom/embeddings", "not one of its API endpoints", 403},
		{"the_configured_endpoint", "POST", "/providers/custom/chat/completions", "path=/api/chat/completions", 200},
		{"GET_on_a_model_call", "GET", "/providers/openai/chat/completions", "takes POST, not GET", 403},
		{"POST_to_models", "POST", "/providers/openai/models", "takes GET, not POST", 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := rawRequest(t, p.socket, tt.method, tt.path, `{"model":"m"}`, nil)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tt.code, tt.want)
			}
		})
	}
	for _, r := range model.requests() {
		if !strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/api/chat/completions") {
			t.Errorf("the key reached %s", r.URL.Path)
		}
	}
}

// rawRequest sends one origin-form request to the proxy exactly as given.
func rawRequest(t *testing.T, socket, method, target, body string, hdr http.Header) (int, string) {
	t.Helper()
	code, answer, err := sendRaw(socket, method, target, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return code, answer
}

func sendRaw(socket, method, target, body string, hdr http.Header) (int, string, error) {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	var extra strings.Builder
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&extra, "%s: %s\r\n", k, v)
		}
	}
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: egress\r\nProxy-Authorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
		method, target, token, len(body), extra.String(), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// A provider call carries only what it needs: the sandbox cannot choose
// who pays or which beta the key buys.
func TestAProviderCallCarriesOnlyTheHeadersItNeeds(t *testing.T) {
	t.Parallel()
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{
		{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: openKey, Organization: "org-admin", Project: "proj-admin"},
		{Name: "claude", Kind: "anthropic", BaseURL: model.URL, Model: "m", Key: claudKey},
		{Name: "pinned", Kind: "anthropic", BaseURL: model.URL, Model: "m", Key: claudKey, APIVersion: "2023-06-01"},
	}}, egress.Options{})
	sandbox := http.Header{
		"Openai-Organization": {"org-attacker"}, "Openai-Project": {"proj-attacker"}, "Anthropic-Beta": {"expensive-beta"},
		"Cookie": {"session=x"}, "X-Forwarded-For": {"1.2.3.4"}, "X-Api-Key": {"sandbox-guess"}, "Authorization": {"Bearer sandbox-guess"},
		"Accept": {"application/json"}, "User-Agent": {"agent/1"}, "Anthropic-Version": {"2024-01-01"}, "X-Stainless-Os": {"Linux"},
	}
	for _, path := range []string{"/providers/openai/chat/completions", "/providers/claude/v1/messages", "/providers/pinned/v1/messages"} {
		if code, body := rawRequest(t, p.socket, "POST", path, `{"model":"m"}`, sandbox); code != 200 {
			t.Fatalf("%s: %d %q", path, code, body)
		}
	}
	reqs := model.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d calls reached the provider", len(reqs))
	}
	allowed := map[string]bool{"Content-Type": true, "Accept": true, "User-Agent": true, "Content-Length": true, "Accept-Encoding": true}
	for i, want := range []map[string]string{
		{"Authorization": "Bearer " + openKey, "Openai-Organization": "org-admin", "Openai-Project": "proj-admin"},
		{"X-Api-Key": claudKey, "Anthropic-Version": "2024-01-01"},
		{"X-Api-Key": claudKey, "Anthropic-Version": "2023-06-01"},
	} {
		got := reqs[i].Header
		for k, v := range want {
			if got.Get(k) != v {
				t.Errorf("call %d: %s = %q, want %q", i, k, got.Get(k), v)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok && !allowed[k] {
				t.Errorf("call %d carried the sandbox's %s: %q", i, k, got[k])
			}
		}
		if got.Get("Accept") != "application/json" || got.Get("User-Agent") != "agent/1" {
			t.Errorf("call %d lost Accept or User-Agent: %v", i, got)
		}
	}
}

// An 18 KiB header is over the documented 16 KiB: refused, and never sent.
func TestAHeaderOverSixteenKiBNeverReachesTheUpstream(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t, nil)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, "127.0.0.1:"+up.port())}, egress.Options{})
	send := func(pad int) int {
		conn, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s/x HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\nX-Pad: %s\r\n\r\n", up.URL, up.Listener.Addr(), token, strings.Repeat("a", pad))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(18 << 10); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("an 18 KiB header: %d, want 431", code)
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("the upstream saw %d requests with an oversized header", n)
	}
	if code := send(15 << 10); code != 200 {
		t.Fatalf("a 15 KiB header: %d, want 200", code)
	}
}

// interceptedClient is a sandbox client that trusts only the run's CA.
func interceptedClient(p proxy, ca egress.CA) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(ca.CertPEM))
	c := p.client(token)
	c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots}
	return c
}

// secretSetup is a secret host behind the proxy, and what reached it.
type secretSetup struct {
	p       proxy
	port    string
	ca      egress.CA
	roots   *x509.CertPool // what the proxy verifies the host with
	mu      sync.Mutex
	seen    []string // "METHOD PATH auth=..."
	fronted atomic.Int32
	stream  streamed
}

func newSecretSetup(t *testing.T, sec egress.Secret) *secretSetup {
	t.Helper()
	st := &secretSetup{}
	srv, roots := tlsServerFor(t, "api.github.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		st.seen = append(st.seen, r.Method+" "+r.URL.Path+" host="+r.Host+" auth="+r.Header.Get("Authorization"))
		st.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	_, st.port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	ca, err := egress.NewCA("r1", []string{"api.github.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st.ca, st.roots = ca, roots
	sec.Name, sec.Hosts, sec.Header, sec.Format, sec.Value = "github", []string{"api.github.test"}, "Authorization", "Bearer {}", githubToken
	st.p = startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, "api.github.test:"+st.port), CA: &ca, Secrets: []egress.Secret{sec}},
		egress.Options{Resolver: resolver{"api.github.test": "127.0.0.1", "other.example": "127.0.0.1"}, RootCAs: roots, OnDecision: st.stream.add})
	return st
}

func (st *secretSetup) requests() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]string(nil), st.seen...)
}

// Inside an intercepted tunnel, a request for another origin (the Host
// header or an absolute URL) is refused, recorded, and gets no secret.
func TestASecretIsNeverSentToAnotherOriginThroughItsTunnel(t *testing.T) {
	t.Parallel()
	st := newSecretSetup(t, egress.Secret{})
	target := "api.github.test:" + st.port
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(st.ca.CertPEM))
	tests := []struct {
		name, request string
		code          int
	}{
		{"another_Host", "GET /user HTTP/1.1\r\nHost: other.example\r\n\r\n", 403},
		{"the_right_name_on_another_port", "GET /user HTTP/1.1\r\nHost: api.github.test:1\r\n\r\n", 403},
		{"an_absolute_URL_for_another_host", "GET https://other.example/user HTTP/1.1\r\nHost: " + target + "\r\n\r\n", 403},
		{"userinfo_in_the_Host", "GET /user HTTP/1.1\r\nHost: api.github.test@other.example\r\n\r\n", 403},
		{"the_tunnels_own_host_in_another_case_with_a_trailing_dot", "GET /user HTTP/1.1\r\nHost: API.GitHub.test.:" + st.port + "\r\n\r\n", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dialTunnel(t, st.p.socket, target)
			if resp, err := http.ReadResponse(conn.r, nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %v %v", resp, err)
			}
			tc := tls.Client(conn.conn, &tls.Config{RootCAs: roots, ServerName: "api.github.test"})
			io.WriteString(tc, tt.request)
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code {
				t.Fatalf("got %d %q, want %d", resp.StatusCode, b, tt.code)
			}
		})
	}
	for _, r := range st.requests() {
		if !strings.Contains(r, "host=api.github.test:"+st.port) && !strings.Contains(r, "host=api.github.test ") {
			t.Errorf("the secret host served %q", r)
		}
	}
	if n := len(st.requests()); n != 1 {
		t.Errorf("the secret host saw %d requests, want the 1 for its own origin", n)
	}
	st.p.srv.Close()
	decisions := st.stream.all()
	var refused int
	for _, d := range decisions {
		if !d.Allowed && strings.Contains(d.Reason, "not the tunnel's") || !d.Allowed && strings.Contains(d.Reason, "names other.example") {
			refused++
		}
	}
	if refused != 4 {
		t.Errorf("decisions %+v; want the 4 fronting attempts recorded as refused", decisions)
	}
}

// A secret's scope (methods, paths) decides which requests inside its
// tunnel get it; the others are sent without it.
func TestASecretIsAddedOnlyWithinItsScope(t *testing.T) {
	t.Parallel()
	st := newSecretSetup(t, egress.Secret{Methods: []string{"GET"}, Paths: []string{"/repos/acme"}})
	c := interceptedClient(st.p, st.ca)
	base := "https://api.github.test:" + st.port
	for _, tt := range []struct{ method, path, auth string }{
		{"GET", "/repos/acme", "Bearer " + githubToken},
		{"GET", "/repos/acme/tool/issues", "Bearer " + githubToken},
		{"GET", "/repos/acmex", ""},
		{"POST", "/repos/acme/tool/issues", ""},
		{"GET", "/repos/acme/../../user", ""},
		{"GET", "/repos/acme/%2e%2e/%2e%2e/user", ""},
		{"GET", "/user", ""},
	} {
		req, _ := http.NewRequest(tt.method, base+tt.path, nil)
		// Sent as written: the client must not clean the path.
		req.URL.Opaque = "//api.github.test:" + st.port + tt.path
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		reqs := st.requests()
		last := reqs[len(reqs)-1]
		if !strings.HasSuffix(last, " auth="+tt.auth) {
			t.Errorf("%s %s reached the host as %q, want auth=%q", tt.method, tt.path, last, tt.auth)
		}
	}
}

// A secret limited to some ports is not intercepted on another: the tunnel
// is plain, and the sandbox sees the host's own certificate.
func TestASecretLimitedToOtherPortsIsNotIntercepted(t *testing.T) {
	t.Parallel()
	st := newSecretSetup(t, egress.Secret{Ports: []int{1}})
	c := interceptedClient(st.p, st.ca)
	if _, err := c.Get("https://api.github.test:" + st.port + "/user"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a port the secret is not for: %v, want the host's own certificate (not the run's CA)", err)
	}
}

// A target that is not a host name never reaches the resolver, even under
// a "*" rule; a request inside an intercepted tunnel is held to the same
// header bound as any other.
func TestJunkTargetsAndOversizedHeadersInsideATunnelAreRefused(t *testing.T) {
	t.Parallel()
	res := &recordingResolver{resolver: resolver{}}
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, "*")}, egress.Options{Resolver: res})
	for _, target := range []string{"evil..example:443", "a!b.example:443", "*.example:443", "-x.example:443"} {
		conn, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", target, target, token)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err == nil && resp.StatusCode == 200 {
			t.Errorf("CONNECT %s was tunnelled", target)
		}
	}
	res.mu.Lock()
	if len(res.asked) != 0 {
		t.Errorf("the proxy resolved %q", res.asked)
	}
	res.mu.Unlock()

	st := newSecretSetup(t, egress.Secret{})
	target := "api.github.test:" + st.port
	conn := dialTunnel(t, st.p.socket, target)
	if resp, err := http.ReadResponse(conn.r, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(st.ca.CertPEM))
	tc := tls.Client(conn.conn, &tls.Config{RootCAs: roots, ServerName: "api.github.test"})
	fmt.Fprintf(tc, "GET /user HTTP/1.1\r\nHost: %s\r\nX-Pad: %s\r\n\r\n", target, strings.Repeat("a", 18<<10))
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("an 18 KiB header inside the tunnel: %d, want 431", resp.StatusCode)
	}
	if n := len(st.requests()); n != 0 {
		t.Fatalf("the secret host saw %d requests with an oversized header", n)
	}
}
