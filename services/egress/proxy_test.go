package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const (
	token    = "run-token-0123456789abcdef"
	openKey  = "sk-test-openai-secret"
	claudKey = "sk-ant-test-secret"
)

// fakeOpenAI answers chat completions only with the right key.
func fakeOpenAI(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+openKey {
			http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fakeAnthropic answers messages only with the right x-api-key.
func fakeAnthropic(t *testing.T) *httptest.Server {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != claudKey || r.Header.Get("Authorization") != "" {
			http.Error(w, `{"type":"error"}`, http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"type":"message","content":[{"type":"text","text":"hello"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type proxy struct {
	srv    *egress.Server
	socket string
}

// streamed collects the decisions a proxy streams through OnDecision, as
// berth-egress hands them to the scheduler's record.
type streamed struct {
	mu  sync.Mutex
	got []isolation.EgressDecision
}

func (s *streamed) add(d isolation.EgressDecision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, d)
}

func (s *streamed) all() []isolation.EgressDecision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]isolation.EgressDecision(nil), s.got...)
}

func startProxy(t testing.TB, pol egress.Policy, opts egress.Options) proxy {
	t.Helper()
	if pol.Token == "" {
		pol.Token = token
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	srv, err := egress.NewServer(pol, opts)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return proxy{srv: srv, socket: socket}
}

// client talks to the proxy the way berth-agent's loopback proxy does.
func (p proxy) client(tok string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", p.socket)
		},
		Proxy:              http.ProxyURL(&url.URL{Scheme: "http", Host: "egress"}),
		ProxyConnectHeader: http.Header{"Proxy-Authorization": {"Bearer " + tok}},
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true},
	}
	return &http.Client{Transport: &tokenRT{tr, tok}}
}

// origin is a client for /providers/ requests (origin form, not proxied).
func (p proxy) origin(tok string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", p.socket)
	}}
	return &http.Client{Transport: &tokenRT{tr, tok}}
}

type tokenRT struct {
	rt  http.RoundTripper
	tok string
}

func (t *tokenRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Proxy-Authorization", "Bearer "+t.tok)
	return t.rt.RoundTrip(r)
}

func do(t *testing.T, c *http.Client, method, u, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func tlsPool(srv *httptest.Server) egress.Options {
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return egress.Options{RootCAs: pool, Logger: quiet}
}

func TestProviderCallsLeaveWithTheKeyTheSandboxNeverHad(t *testing.T) {
	t.Parallel()
	oa, an := fakeOpenAI(t), fakeAnthropic(t)
	pol := egress.Policy{RunID: "r1", Agent: "ops", Providers: []egress.Provider{
		{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "gpt-4o-mini", Key: openKey},
		{Name: "claude", Kind: "anthropic", BaseURL: an.URL, Model: "claude-haiku-4-5", Key: claudKey},
	}}
	p := startProxy(t, pol, tlsPool(an))
	tests := []struct {
		name, path, body, want string
		code                   int
		hdr                    []string
	}{
		{"OpenAI_gets_a_bearer_key", "/providers/openai/chat/completions", `{"model":"gpt-4o-mini","messages":[]}`, `"hi"`, 200, nil},
		{"a_key_sent_by_the_sandbox_is_replaced", "/providers/openai/chat/completions", `{"model":"gpt-4o-mini"}`, `"hi"`, 200, []string{"Authorization", "Bearer stolen"}},
		{"Anthropic_gets_x_api_key_over_TLS", "/providers/claude/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":10}`, `hello`, 200, []string{"Authorization", "Bearer x"}},
		{"another_model_is_refused", "/providers/openai/chat/completions", `{"model":"gpt-5"}`, `model "gpt-5" is not the agent's model "gpt-4o-mini"`, 403, nil},
		{"a_body_without_model_is_refused", "/providers/openai/chat/completions", `{}`, "names no model", 403, nil},
		{"a_provider_of_no_run_is_refused", "/providers/mistral/chat/completions", `{"model":"x"}`, `"mistral" is not one of the run's providers`, 403, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(t, p.origin(token), "POST", "http://egress"+tt.path, tt.body, tt.hdr...)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tt.code, tt.want)
			}
			if strings.Contains(body, openKey) || strings.Contains(body, claudKey) {
				t.Fatalf("the answer carries a key: %q", body)
			}
		})
	}
}

func TestRequestsWithoutThisRunsTokenAreRefused(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}}, egress.Options{})
	for name, tok := range map[string]string{"no_token": "", "another_runs_token": "run-token-of-another-run-0000"} {
		t.Run(name, func(t *testing.T) {
			code, body := do(t, p.origin(tok), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
			if code != http.StatusProxyAuthRequired || !strings.Contains(body, "no valid token") {
				t.Fatalf("got %d %q, want 407", code, body)
			}
		})
	}
}

func TestAllowRulesDecideEachRequest(t *testing.T) {
	t.Parallel()
	site := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "index") }))
	t.Cleanup(site.Close)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" {
			http.Error(w, "token leaked upstream", 500)
			return
		}
		io.WriteString(w, "plain "+r.Method)
	}))
	t.Cleanup(plain.Close)
	siteAddr, plainAddr := site.Listener.Addr().String(), plain.Listener.Addr().String()
	mustRule := func(s string) isolation.EgressRule {
		r, err := isolation.ParseEgressRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	_, plainPort, _ := net.SplitHostPort(plainAddr)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: []isolation.EgressRule{
		mustRule(siteAddr),
		mustRule("GET,HEAD 127.0.0.1:" + plainPort),
		mustRule("*.internal.test"),
	}}, egress.Options{})
	tests := []struct {
		name, method, url, want string
		code                    int
	}{
		{"CONNECT_to_an_allowed_host_is_tunnelled", "GET", site.URL + "/simple/", "index", 200},
		{"plain_HTTP_with_an_allowed_method_passes", "GET", plain.URL + "/x", "plain GET", 200},
		{"plain_HTTP_with_another_method_is_refused", "POST", plain.URL + "/x", "no [agents.egress] allow rule matches POST 127.0.0.1:" + plainPort, 403},
		{"a_host_no_rule_names_is_refused", "GET", "http://evil.example/", "no [agents.egress] allow rule matches GET evil.example:80", 403},
		{"the_metadata_service_is_refused", "GET", "http://169.254.169.254/latest/meta-data/", "no [agents.egress] allow rule matches", 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(t, p.client(token), tt.method, tt.url, "")
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tt.code, tt.want)
			}
		})
	}
	t.Run("a_refused_CONNECT_gets_403_with_the_reason", func(t *testing.T) {
		conn, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "CONNECT pypi.example:443 HTTP/1.1\r\nHost: pypi.example:443\r\nProxy-Authorization: Bearer %s\r\n\r\n", token)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 403 || !strings.Contains(string(b), "no [agents.egress] allow rule matches CONNECT pypi.example:443") {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
	})
}

// resolver maps names to addresses, as a DNS server would.
type resolver map[string]string

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := r[host]
	if !ok {
		return nil, fmt.Errorf("no such host %s", host)
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func TestInternalDestinationsAreRefusedAtDialTimeUnlessARuleNamesThem(t *testing.T) {
	t.Parallel()
	intake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "intake") }))
	t.Cleanup(intake.Close)
	_, port, _ := net.SplitHostPort(intake.Listener.Addr().String())
	parse := func(ss ...string) []isolation.EgressRule {
		var rules []isolation.EgressRule
		for _, s := range ss {
			r, err := isolation.ParseEgressRule(s)
			if err != nil {
				t.Fatal(err)
			}
			rules = append(rules, r)
		}
		return rules
	}
	all := parse("*", "*:"+port)
	named := parse("*", "*:"+port, "named.test:"+port)
	res := resolver{"rebind.test": "127.0.0.1", "named.test": "127.0.0.1", "meta.test": "169.254.169.254", "lan.test": "10.1.2.3"}
	tests := []struct {
		name  string
		rules []isolation.EgressRule
		url   string
		code  int
		want  string
	}{
		{"loopback_by_address_is_refused_even_under_a_star_rule", all, "http://127.0.0.1:" + port + "/", 403, "127.0.0.1 resolves to 127.0.0.1, a loopback address"},
		{"a_name_resolving_to_loopback_is_refused", all, "http://rebind.test:" + port + "/", 403, "a loopback address"},
		{"the_metadata_address_is_refused", all, "http://meta.test/", 403, "a link-local address"},
		{"a_private_address_is_refused", all, "http://lan.test/", 403, "a private address"},
		{"a_rule_naming_the_host_lets_it_through", named, "http://named.test:" + port + "/", 200, "intake"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startProxy(t, egress.Policy{RunID: "r1", Allow: tt.rules}, egress.Options{Resolver: res})
			code, body := do(t, p.client(token), "GET", tt.url, "")
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tt.code, tt.want)
			}
		})
	}
}

// Every decision is streamed, with its bytes; the record that keeps a
// bounded part of them is held by TestARecordKeeps* (launch_test.go).
func TestDecisionsAreStreamedWithBytes(t *testing.T) {
	t.Parallel()
	var stream streamed
	recorded := make(chan struct{}, 3)
	oa := fakeOpenAI(t)
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}},
		egress.Options{OnDecision: func(d isolation.EgressDecision) { stream.add(d); recorded <- struct{}{} }})
	// A provider call is recorded once its body is copied, which may be
	// after the client has it: each request waits for its decision, so the
	// order is the requests'.
	do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	<-recorded
	do(t, p.client(token), "GET", "http://refused.example/a", "")
	<-recorded
	do(t, p.client(token), "GET", "http://refused.example/b", "")
	<-recorded
	p.srv.Close() // the run ends: every decision is in
	got := stream.all()
	if len(got) != 3 {
		t.Fatalf("got %d decisions streamed; want the 3 requests'", len(got))
	}
	ok, refused := got[0], got[1]
	if !ok.Allowed || ok.Rule != "provider openai" || ok.Method != "POST" || ok.Path != "/v1/chat/completions" || ok.BytesUp != int64(len(`{"model":"m"}`)) || ok.BytesDown == 0 || ok.Time.IsZero() {
		t.Fatalf("provider decision = %+v", ok)
	}
	if refused.Allowed || refused.Host != "refused.example" || refused.Port != 80 || refused.Path != "/a" || !strings.Contains(refused.Reason, "no [agents.egress] allow rule") {
		t.Fatalf("refused decision = %+v", refused)
	}
	data, _ := json.Marshal(got)
	if strings.Contains(string(data), openKey) {
		t.Fatal("a decision carries the key")
	}
}

func TestOversizedHeadersAreRefused(t *testing.T) {
	t.Parallel()
	p := startProxy(t, egress.Policy{RunID: "r1"}, egress.Options{MaxHeaderBytes: 4 << 10})
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Small enough to sit in the socket's buffer whole, so the answer is read.
	fmt.Fprintf(conn, "GET http://x.example/ HTTP/1.1\r\nHost: x.example\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 20<<10))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("got %d, want 431", resp.StatusCode)
	}
}
