package tools

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

type hostTable map[string]string

func (n hostTable) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

// behindEgress is env with web_fetch going through a run's egress proxy
// (services/egress on a Unix socket, agent/egress on loopback) that allows
// only allow, resolving example.com to the test servers on 127.0.0.1.
func behindEgress(t *testing.T, env Env, allow ...string) Env {
	t.Helper()
	const token = "run-token-0123456789abcdef"
	var rules []isolation.EgressRule
	for _, a := range allow {
		r, err := isolation.ParseEgressRule(a)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, Allow: rules},
		egress.Options{Resolver: hostTable{"example.com": "127.0.0.1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	e.ProxyAddr = p.Addr()
	env.Network, env.ProxyURL, env.ProxyEnv = true, "http://"+p.Addr(), agentegress.EnvFor(e)
	return env
}

func TestWebFetchGoesThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "through the proxy") })
	plain := httptest.NewServer(page)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(page) // its certificate names example.com
	t.Cleanup(secure.Close)
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())
	_, securePort, _ := net.SplitHostPort(secure.Listener.Addr().String())
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		url      string
		caBundle string
		want     string // in the output, or in the error when errHas
		errHas   bool
	}{
		{name: "An_allowed_host_is_fetched", url: "http://example.com:" + plainPort + "/", want: "HTTP 200 OK\ncontent-type: text/plain; charset=utf-8\n\nthrough the proxy"},
		{name: "A_host_no_rule_allows_gets_the_proxys_403_with_its_reason", url: "http://files.example/x", want: "HTTP 403 Forbidden\ncontent-type: text/plain; charset=utf-8\n\nberth egress refused GET files.example:80: no [agents.egress] allow rule matches GET files.example:80"},
		{name: "An_allowed_HTTPS_host_is_verified_against_the_runs_CA_bundle", url: "https://example.com:" + securePort + "/", caBundle: bundle, want: "through the proxy"},
		{name: "An_HTTPS_host_the_runs_CA_bundle_does_not_vouch_for_is_refused", url: "https://example.com:" + securePort + "/", want: "certificate", errHas: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := behindEgress(t, workspace(t), "example.com:"+plainPort, "example.com:"+securePort)
			env.CABundle = tt.caBundle
			out, err := call(t, env, "web_fetch", `{"url":"`+tt.url+`"}`)
			got := out
			if tt.errHas {
				if err == nil {
					t.Fatalf("web_fetch %s = %q, want an error", tt.url, out)
				}
				got = err.Error()
			} else if err != nil {
				t.Fatalf("web_fetch %s: %v", tt.url, err)
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("web_fetch %s = %q, want %q in it", tt.url, got, tt.want)
			}
		})
	}
}

func TestShellCommandsGetTheProxyEnvironmentAndNoToken(t *testing.T) {
	t.Parallel()
	env := behindEgress(t, workspace(t))
	res := runShell(t, env, `{"command": "env"}`)
	for _, want := range []string{"HTTP_PROXY=" + env.ProxyURL, "HTTPS_PROXY=" + env.ProxyURL, "https_proxy=" + env.ProxyURL, "NO_PROXY=localhost,127.0.0.1,::1", "PATH=" + ShellPath} {
		if !strings.Contains(res.Stdout, want+"\n") {
			t.Errorf("shell environment lacks %s:\n%s", want, res.Stdout)
		}
	}
	if strings.Contains(res.Stdout, "run-token") {
		t.Errorf("the run's token reached the shell:\n%s", res.Stdout)
	}
}
