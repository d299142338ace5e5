package egress_test

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

const agentToken = "agent-token-0123456789abcdef"

// berth-agent's own channel reaches a host only its own rule allows, over
// plain HTTP and through CONNECT; the loopback proxy every tool uses is
// refused there with the reason; no origin ever sees a token.
func TestTheAgentsOwnChannelReachesWhatItsToolsLoopbackProxyCannot(t *testing.T) {
	t.Parallel()
	leaked := make(chan string, 8)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Proxy-Authorization"); v != "" {
			leaked <- v
		}
		io.WriteString(w, "results")
	})
	plain := httptest.NewServer(handler)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(handler)
	t.Cleanup(secure.Close)
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())
	_, securePort, _ := net.SplitHostPort(secure.Listener.Addr().String())
	plainURL := "http://searx.test:" + plainPort + "/search"
	secureURL := "https://search.test:" + securePort + "/search"
	var rules []egresspolicy.Rule
	for _, raw := range []string{plainURL, secureURL} {
		u, _ := url.Parse(raw)
		r, err := egresspolicy.AgentRule("web_search", u, "GET")
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}

	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, AgentToken: agentToken, Allow: rules},
		egress.Options{Resolver: resolver{"searx.test": "127.0.0.1", "search.test": "127.0.0.1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	e := agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token, AgentToken: agentToken}
	loop, err := agentegress.Listen(e)
	if err != nil {
		t.Fatal(err)
	}
	go loop.Serve()
	t.Cleanup(func() { loop.Close() })

	insecure := &tls.Config{InsecureSkipVerify: true}
	own := &http.Client{Transport: agentegress.OwnChannel(e)(&http.Transport{TLSClientConfig: insecure})}
	tools := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: loop.Addr()}), TLSClientConfig: insecure}}
	for _, u := range []string{plainURL, secureURL} {
		resp, err := own.Get(u)
		if err != nil {
			t.Fatalf("the agent's own GET %s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "results" {
			t.Errorf("the agent's own GET %s: %d %q", u, resp.StatusCode, b)
		}
	}
	resp, err := tools.Get(plainURL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "allowed for berth-agent's own web_search only") {
		t.Errorf("a tool's GET of the agent's host: %d %q", resp.StatusCode, b)
	}
	if _, err := tools.Get(secureURL); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("a tool's CONNECT to the agent's host: %v, want the tunnel refused", err)
	}
	if agentegress.OwnChannel(agentproto.Egress{Socket: socket, Token: token}) != nil {
		t.Error("a request without an agent token got an own channel")
	}
	select {
	case v := <-leaked:
		t.Errorf("an origin saw Proxy-Authorization %q", v)
	default:
	}
}
