package egress_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const (
	agentToken = "agent-token-0123456789abcdef-SECRET"
	searchKey  = "search-key-SECRET-0123456789"
)

// keysSeen is what a fake upstream saw in one header, request by request.
type keysSeen struct {
	mu   sync.Mutex
	keys []string
}

func (k *keysSeen) add(v string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, v)
}

func (k *keysSeen) with(v string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, got := range k.keys {
		if got == v {
			n++
		}
	}
	return n
}

func agentRule(t *testing.T, what, raw string, methods ...string) isolation.EgressRule {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	r, err := egresspolicy.AgentRule(what, u, methods...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The search provider's host and key belong to berth-agent's own channel:
// a request with the run token (every tool's, through berth-agent's
// loopback proxy) is refused with a reason that says whose host it is, by
// CONNECT and by plain HTTP; the agent token's request gets the key; a
// tool that an admin's rule lets reach the host gets there without it.
func TestTheAgentsOwnChannelAloneReachesTheSearchHostAndGetsItsKey(t *testing.T) {
	t.Parallel()
	var seen keysSeen
	search, roots := tlsServerFor(t, "search.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.add(r.Header.Get("X-Subscription-Token"))
		if r.Header.Get("X-Subscription-Token") != searchKey {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"type":"search"}`)
	}))
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.add(r.Header.Get("X-Subscription-Token"))
		io.WriteString(w, "searxng")
	}))
	t.Cleanup(plain.Close)
	_, port, _ := net.SplitHostPort(search.Listener.Addr().String())
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())
	ca, err := egress.NewCA("r1", []string{"search.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	secret := egress.Secret{Name: "brave", Hosts: []string{"search.test"}, Header: "X-Subscription-Token", Format: "{}", Value: searchKey, AgentTool: "web_search"}
	rules := []isolation.EgressRule{
		agentRule(t, "web_search", "https://search.test:"+port),
		agentRule(t, "MCP server notes", "http://searx.test:"+plainPort, "GET", "POST"),
	}
	policy := func(extra ...string) egress.Policy {
		pol := egress.Policy{RunID: "r1", AgentToken: agentToken, Allow: rules, CA: &ca, Secrets: []egress.Secret{secret}}
		for _, raw := range extra {
			r, err := isolation.ParseEgressRule(raw)
			if err != nil {
				t.Fatal(err)
			}
			pol.Allow = append(pol.Allow, r)
		}
		return pol
	}
	opts := func(s *streamed) egress.Options {
		return egress.Options{Resolver: resolver{"search.test": "127.0.0.1", "searx.test": "127.0.0.1"}, RootCAs: roots, OnDecision: s.add}
	}
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM([]byte(ca.CertPEM))
	trusting := func(c *http.Client, pool *x509.CertPool) *http.Client {
		c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
		return c
	}
	searchURL := "https://search.test:" + port + "/res/v1/web/search?q=x"
	plainURL := "http://searx.test:" + plainPort + "/search"

	var stream streamed
	p := startProxy(t, policy(), opts(&stream))
	tools := trusting(p.client(token), sandboxRoots)
	for _, u := range []string{searchURL, plainURL} {
		code, body := do(t, tools, "GET", u, "")
		if u == searchURL && code != 0 {
			t.Fatalf("a tool's CONNECT to the search host: %d %q, want the tunnel refused", code, body)
		}
		if u == plainURL && (code != http.StatusForbidden || !strings.Contains(body, "allowed for berth-agent's own MCP server notes only")) {
			t.Errorf("a tool's GET of the MCP host: %d %q, want 403 saying whose host it is", code, body)
		}
	}
	// The CONNECT's refusal, as curl shows it.
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "CONNECT search.test:"+port+" HTTP/1.1\r\nHost: search.test:"+port+"\r\nConnection: close\r\nProxy-Authorization: Bearer "+token+"\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(io.LimitReader(conn, 4096))
	conn.Close()
	if !strings.HasPrefix(string(answer), "HTTP/1.1 403") || !strings.Contains(string(answer), "allowed for berth-agent's own web_search only") {
		t.Errorf("the run token's CONNECT to the search host: %q, want 403 and the reason", answer)
	}
	if code, _ := do(t, trusting(p.client("not-"+agentToken), sandboxRoots), "GET", searchURL, ""); code != 0 {
		t.Errorf("a guessed token got %d", code)
	}

	own := trusting(p.client(agentToken), sandboxRoots)
	if code, body := do(t, own, "GET", searchURL, ""); code != 200 || body != `{"type":"search"}` {
		t.Fatalf("the agent's own search: %d %q, want the key added", code, body)
	}
	if code, body := do(t, own, "GET", plainURL, ""); code != 200 || body != "searxng" {
		t.Fatalf("the agent's own GET of its MCP host: %d %q", code, body)
	}
	if n := seen.with(searchKey); n != 1 {
		t.Errorf("the search API saw its key %d times, want once (the agent's)", n)
	}
	p.srv.Close()
	var refusals, own2 int
	for _, d := range stream.all() {
		if !d.Allowed && strings.Contains(d.Reason, "berth-agent's own") {
			refusals++
		}
		if d.Allowed && (d.Rule == "secret brave" || strings.HasPrefix(d.Rule, "MCP server notes: ")) {
			own2++
		}
	}
	if refusals < 2 || own2 < 2 {
		t.Errorf("decisions %+v: want the tools' refusals with their reason and the agent's requests under its rules", stream.all())
	}

	// An admin's rule lets tools reach the host: tunnelled as it is, the
	// key never added to a tool's request.
	var stream2 streamed
	p2 := startProxy(t, policy("search.test:"+port), opts(&stream2))
	before := len(seen.keys)
	if code, body := do(t, trusting(p2.client(token), roots), "GET", searchURL, ""); code != http.StatusUnauthorized {
		t.Errorf("a tool under an admin's rule: %d %q, want the API's own refusal (no key)", code, body)
	}
	if len(seen.keys) != before+1 || seen.with(searchKey) != 1 {
		t.Errorf("the search API saw %q, want one more request, without the key", seen.keys)
	}
}
