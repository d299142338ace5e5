package runplan_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

const mcpConfig = `
[[egress.secrets]]
name  = "tracker"
env   = "TRACKER_TOKEN"
hosts = ["mcp.tracker.example"]
paths = ["/mcp"]

[[egress.secrets]]
name   = "brave"
env    = "BRAVE_KEY"
hosts  = ["api.search.brave.com"]
header = "X-Subscription-Token"
format = "{}"

[[agents]]
id = "ops"
[agents.egress]
allow = ["mcp.tracker.example:443", "api.search.brave.com"]
[[agents.mcp]]
name    = "files"
command = ["mcp-files", "/workspace/docs"]
tools   = ["read"]
timeout = "1500ms"
[[agents.mcp]]
name           = "tracker"
url            = "https://mcp.tracker.example/mcp"
headers_secret = "tracker"
[agents.web_search]
provider = "brave"
secret   = "brave"
`

func TestARunsRequestCarriesItsMCPServersAndWebSearchButNoHeader(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, mcpConfig)
	a, err := cfg.Agent("ops")
	if err != nil {
		t.Fatal(err)
	}
	want := []agentproto.MCPServer{
		{Name: "files", Command: []string{"mcp-files", "/workspace/docs"}, Tools: []string{"read"}, TimeoutSeconds: 2},
		{Name: "tracker", URL: "https://mcp.tracker.example/mcp"},
	}
	if got := runplan.MCPServers(a); !reflect.DeepEqual(got, want) {
		t.Errorf("MCP servers = %+v, want %+v (the timeout rounded up)", got, want)
	}
	if got, want := runplan.WebSearch(a), (&agentproto.WebSearch{Kind: "brave", BaseURL: "https://api.search.brave.com"}); !reflect.DeepEqual(got, want) {
		t.Errorf("web search = %+v, want %+v", got, want)
	}
}

func TestAnMCPServersHeadersSecretIsOneOfTheRunsEgressSecretsWithItsCA(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, mcpConfig)
	host := facts(t, map[string]string{"TRACKER_TOKEN": "tracker-token-value", "BRAVE_KEY": "brave-key-value"})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress == nil || p.Egress.CABundle == "" {
		t.Fatalf("egress %+v; want a plan with the run's CA bundle", p.Egress)
	}
	i := slices.IndexFunc(p.Egress.Secrets, func(s isolation.EgressSecret) bool { return s.Name == "tracker" })
	if i < 0 {
		t.Fatalf("secrets %+v; want tracker", p.Egress.Secrets)
	}
	if s := p.Egress.Secrets[i]; s.Value != "tracker-token-value" || !slices.Equal(s.Hosts, []string{"mcp.tracker.example"}) || s.Header != "Authorization" {
		t.Errorf("tracker secret = %+v; want its value, for mcp.tracker.example, as Authorization", s)
	}

	e, err := runplan.Explain(cfg, "ops", host)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(e.Why["mcp"], "\n")
	wantLines := []string{
		"files: stdio, mcp-files /workspace/docs started inside the sandbox under the tools' confinement; tools: read; timeout 1.5s",
		"tracker: streamable HTTP to https://mcp.tracker.example/mcp through the egress proxy, which adds the header from secret tracker (never inside the sandbox); tools: every one the server lists",
	}
	if !slices.Equal(lines, wantLines) {
		t.Errorf("why mcp =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}
	if want := "web_search through the egress proxy: brave at https://api.search.brave.com, its key added by the proxy from secret brave"; e.Why["web_search"] != want {
		t.Errorf("why web_search = %q, want %q", e.Why["web_search"], want)
	}
	if strings.Contains(e.Why["mcp"]+e.Why["web_search"], "value") {
		t.Error("the explanation holds a secret's value")
	}
}
