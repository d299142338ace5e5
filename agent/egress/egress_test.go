package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const token = "run-token-0123456789abcdef"

// stack is a run's egress proxy on its socket and the agent's loopback proxy.
func stack(t *testing.T, pol egress.Policy, opts egress.Options) *agentegress.Proxy {
	t.Helper()
	pol.Token = token
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
	p, err := agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve()
	t.Cleanup(func() { p.Close() })
	return p
}

func TestToolsReachAllowedHostsAndProvidersThroughTheLoopbackProxy(t *testing.T) {
	t.Parallel()
	index := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" {
			http.Error(w, "token leaked", 500)
			return
		}
		io.WriteString(w, "simple index")
	}))
	t.Cleanup(index.Close)
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-secret" {
			http.Error(w, "no key", 401)
			return
		}
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(model.Close)
	_, port, _ := net.SplitHostPort(index.Listener.Addr().String())
	// A name, not 127.0.0.1 (which NO_PROXY keeps local): the proxy resolves it.
	indexURL := "https://pypi.test:" + port
	rule, err := isolation.ParseEgressRule("pypi.test:" + port)
	if err != nil {
		t.Fatal(err)
	}
	p := stack(t, egress.Policy{RunID: "r1", Allow: []isolation.EgressRule{rule},
		Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: "sk-secret"}}}, egress.Options{Resolver: resolver{"pypi.test": "127.0.0.1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	proxied := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: p.Addr()}),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}

	t.Run("HTTPS_to_an_allowed_host_is_tunnelled", func(t *testing.T) {
		resp, err := proxied.Get(indexURL + "/simple/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "simple index" {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
	})
	t.Run("a_refused_host_gets_403_with_the_reason", func(t *testing.T) {
		resp, err := proxied.Get("http://files.example/x")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "no [agents.egress] allow rule matches GET files.example:80") {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
	})
	t.Run("the_provider_base_URL_reaches_the_model_with_the_key_added", func(t *testing.T) {
		base := isolation.ProviderProxyURL(p.Addr(), "openai")
		resp, err := http.Post(base+"/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != `{"ok":true}` {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
	})
	t.Run("curl_works_unchanged_with_the_proxy_environment", func(t *testing.T) {
		_, err := exec.LookPath("curl")
		testenv.Need(t, err == nil, "curl is not installed (apt-get install curl)")
		cmd := exec.Command("curl", "-sk", indexURL+"/simple/")
		cmd.Env = append(agentegress.Env(p.Addr()), "PATH=/usr/bin:/bin")
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "simple index" {
			t.Fatalf("curl: %v %q", err, out)
		}
	})
}

type resolver map[string]string

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := r[host]
	if !ok {
		return nil, fmt.Errorf("no such host %s", host)
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func TestTheToolEnvironmentNamesTheProxyAndNoToken(t *testing.T) {
	t.Parallel()
	env := strings.Join(agentegress.Env("127.0.0.1:3128"), "\n")
	for _, want := range []string{"HTTP_PROXY=http://127.0.0.1:3128", "HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "NO_PROXY=localhost,127.0.0.1,::1"} {
		if !strings.Contains(env, want) {
			t.Errorf("tool environment lacks %s", want)
		}
	}
}

func TestToolsTrustTheRunsCAOnlyWhenItInterceptsSecretHosts(t *testing.T) {
	t.Parallel()
	plain := strings.Join(agentegress.EnvFor(agentproto.Egress{ProxyAddr: "127.0.0.1:3128"}), "\n")
	if strings.Contains(plain, "SSL_CERT_FILE") {
		t.Errorf("a run without secrets must keep the system's roots: %s", plain)
	}
	env := strings.Join(agentegress.EnvFor(agentproto.Egress{ProxyAddr: "127.0.0.1:3128", CABundle: "/run/berth-egress/ca.pem"}), "\n")
	for _, k := range []string{"SSL_CERT_FILE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
		if !strings.Contains(env, k+"=/run/berth-egress/ca.pem") {
			t.Errorf("tool environment lacks %s", k)
		}
	}
}

// A model's server-sent events reach the tool one by one, as the model
// sends them: the second event is sent only once the tool has read the
// first, so a proxy that held the stream back would never deliver it.
func TestAnEventStreamReachesTheToolAsItArrives(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	}))
	t.Cleanup(model.Close)
	p := stack(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: "sk-secret"}}},
		egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, isolation.ProviderProxyURL(p.Addr(), "openai")+"/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewReader(resp.Body)
	first, err := events.ReadString('\n')
	if err != nil || first != "data: one\n" {
		t.Fatalf("first event: %q, %v; want it before the model sends the next", first, err)
	}
	close(release)
	rest, err := io.ReadAll(events)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest of the stream: %q, %v", rest, err)
	}
}

// The proxy refuses these without reading all of their bodies (it drains
// at most MaxProviderBody) and closes the connection: the relay, still
// writing the body, must pass the refusal on rather than its own broken
// pipe.
func TestARefusalOfARequestWithALargeBodyReachesTheToolAsTheProxySentIt(t *testing.T) {
	t.Parallel()
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ok":true}`) }))
	t.Cleanup(model.Close)
	p := stack(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: "sk-secret"}}},
		egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxProviderBody: 1 << 20})
	body := strings.Repeat("x", 4<<20)
	for _, target := range []struct{ name, requestURI, host string }{
		{"a_provider_no_rule_names", "/providers/nope/chat/completions", p.Addr()},
		{"a_host_no_rule_allows", "http://files.example/upload", "files.example"},
	} {
		t.Run(target.name, func(t *testing.T) {
			for i := range 40 {
				code, answer := postClosing(t, p.Addr(), target.requestURI, target.host, body)
				if code != http.StatusForbidden || !strings.Contains(answer, "berth egress refused") {
					t.Fatalf("attempt %d: %d %q; want the proxy's 403", i, code, answer)
				}
			}
		})
	}
}

// postClosing sends a POST with Connection: close as a tool would and reads
// the answer while the body is still being written.
func postClosing(t *testing.T, addr, requestURI, host, body string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	go fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", requestURI, host, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer from the relay: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}
