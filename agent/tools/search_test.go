package tools

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const braveKey = "brave-key-SECRET-0123456789"

func search(t *testing.T, env Env, cfg agentproto.WebSearch, args string) ([]SearchResult, error) {
	t.Helper()
	out, err := Filter(WebSearch(env, &cfg), nil, nil).Call(context.Background(), "web_search", json.RawMessage(args))
	if err != nil {
		return nil, err
	}
	var res struct {
		Results []SearchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("web_search output is not its JSON: %v\n%s", err, out)
	}
	return res.Results, nil
}

// fakeSearXNG answers /search?format=json as SearXNG does.
func fakeSearXNG(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/searxng/search" || r.URL.Query().Get("format") != "json" {
			http.Error(w, "Forbidden", http.StatusForbidden) // SearXNG without json in its formats
			return
		}
		q := r.URL.Query().Get("q")
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"query": q, "number_of_results": 4, "results": []map[string]any{
			{"title": "Berth <b>" + q + "</b>", "url": "https://berth.example/docs", "content": "A <em>systemd-native</em> agent gateway.", "engine": "duckduckgo"},
			{"title": "Not a web page", "url": "javascript:alert(1)", "content": "left out"},
			{"title": "Long", "url": "https://long.example/", "content": strings.Repeat("word ", 400)},
			{"title": "Fourth", "url": "https://fourth.example/", "content": "four"},
		}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestWebSearchOverSearXNG(t *testing.T) {
	t.Parallel()
	srv := fakeSearXNG(t)
	env := workspace(t)
	env.Network = true
	cfg := agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: srv.URL + "/searxng/"}

	results, err := search(t, env, cfg, `{"query":"gateway"}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 {
		t.Fatalf("results = %+v, want the three http(s) ones", results)
	}
	if want := (SearchResult{Title: "Berth gateway", URL: "https://berth.example/docs", Snippet: "A systemd-native agent gateway."}); results[0] != want {
		t.Errorf("first result = %+v, want %+v (markup removed)", results[0], want)
	}
	if n := len([]rune(results[1].Snippet)); n != searchSnipLimit+1 || !strings.HasSuffix(results[1].Snippet, "…") {
		t.Errorf("a long snippet has %d characters, want it capped at %d and marked", n, searchSnipLimit)
	}
	if results, err := search(t, env, cfg, `{"query":"gateway","count":1}`); err != nil || len(results) != 1 {
		t.Errorf("count 1 gave %+v, %v", results, err)
	}
}

func TestWebSearchErrorsAreClearForTheModel(t *testing.T) {
	t.Parallel()
	srv := fakeSearXNG(t)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>search</html>") }))
	t.Cleanup(garbage.Close)
	tests := []struct {
		name    string
		cfg     agentproto.WebSearch
		network bool
		args    string
		errHas  string
	}{
		{name: "An_agent_without_network", cfg: agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: srv.URL}, args: `{"query":"x"}`, errHas: "no network access"},
		{name: "An_empty_query", cfg: agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: srv.URL}, network: true, args: `{"query":" "}`, errHas: "query is empty"},
		{name: "Too_many_results", cfg: agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: srv.URL}, network: true, args: `{"query":"x","count":50}`, errHas: "count must be 1 to 10"},
		{name: "A_SearXNG_without_its_JSON_format", cfg: agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: srv.URL}, network: true, args: `{"query":"x"}`, errHas: "the searxng search answered 403 Forbidden"},
		{name: "An_answer_that_is_not_JSON", cfg: agentproto.WebSearch{Kind: SearchSearXNG, BaseURL: garbage.URL}, network: true, args: `{"query":"x"}`, errHas: "answered something else than its JSON results"},
		{name: "An_unknown_provider", cfg: agentproto.WebSearch{Kind: "altavista", BaseURL: srv.URL}, network: true, args: `{"query":"x"}`, errHas: `provider "altavista" is not searxng or brave`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := workspace(t)
			env.Network = tt.network
			_, err := search(t, env, tt.cfg, tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("web_search gave %v, want an error with %q", err, tt.errHas)
			}
		})
	}
	if tools := WebSearch(workspace(t), nil); tools != nil {
		t.Errorf("a run without a search provider got %d web_search tools", len(tools))
	}
}

func TestWebSearchOverBraveGetsItsKeyFromTheEgressProxy(t *testing.T) {
	t.Parallel()
	brave := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Subscription-Token") != braveKey {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"type":"ErrorResponse","error":{"code":"SUBSCRIPTION_TOKEN_INVALID","status":401}}`)
			return
		}
		if r.URL.Path != "/res/v1/web/search" || r.URL.Query().Get("count") != "2" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"type":"search","query":{"original":"berth"},"web":{"type":"search","results":[
			{"title":"Berth <strong>docs</strong>","url":"https://berth.example/","description":"The <strong>berth</strong> gateway.","language":"en"},
			{"title":"Second","url":"https://second.example/","description":"two"}]}}`)
	}))
	t.Cleanup(brave.Close)
	_, port, _ := net.SplitHostPort(brave.Listener.Addr().String())
	cfg := agentproto.WebSearch{Kind: SearchBrave, BaseURL: "https://example.com:" + port}

	tests := []struct {
		name        string
		secretPaths []string
		errHas      string
	}{
		{name: "The_proxy_adds_the_key_and_the_results_come_back"},
		{name: "A_request_outside_the_secrets_scope_is_refused_by_Brave_and_says_why", secretPaths: []string{"/res/v1/news"},
			errHas: "the brave search answered 401 Unauthorized (the egress proxy adds the API key as an egress secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			secret := egress.Secret{Name: "brave", Hosts: []string{"example.com"}, Header: "X-Subscription-Token", Format: "{}", Paths: tt.secretPaths, Value: braveKey}
			env := behindEgressWithSecret(t, workspace(t), brave, "example.com:"+port, secret)
			results, err := search(t, env, cfg, `{"query":"berth","count":2}`)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("web_search gave %+v, %v; want an error with %q", results, err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := []SearchResult{{Title: "Berth docs", URL: "https://berth.example/", Snippet: "The berth gateway."}, {Title: "Second", URL: "https://second.example/", Snippet: "two"}}
			if len(results) != 2 || results[0] != want[0] || results[1] != want[1] {
				t.Errorf("results = %+v, want %+v", results, want)
			}
		})
	}
}

// behindEgressWithSecret is env behind a run's egress proxy that allows
// rule and adds secret, intercepting TLS to its hosts with the run's CA
// (which env trusts) and verifying upstream against upstream's certificate.
func behindEgressWithSecret(t *testing.T, env Env, upstream *httptest.Server, rule string, secret egress.Secret) Env {
	t.Helper()
	const token = "run-token-0123456789abcdef"
	r, err := isolation.ParseEgressRule(rule)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := egress.NewCA("r1", secret.Hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(upstream.Certificate())
	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, Allow: []isolation.EgressRule{r}, Secrets: []egress.Secret{secret}, CA: &ca},
		egress.Options{Resolver: hostTable{"example.com": "127.0.0.1"}, RootCAs: roots, Logger: quietLog})
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
	e := agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token}
	p, err := agentegress.Listen(e)
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve()
	t.Cleanup(func() { p.Close() })
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bundle, []byte(ca.CertPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	env.Network, env.ProxyURL, env.CABundle = true, "http://"+p.Addr(), bundle
	return env
}
