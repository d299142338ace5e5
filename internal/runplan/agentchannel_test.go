package runplan_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// No [agents.egress] allow rule names the search or the MCP host: their
// URLs are the rules of berth-agent's own requests, and only those.
const agentChannelConfig = `
[[egress.secrets]]
name   = "brave"
env    = "BRAVE_KEY"
hosts  = ["api.search.brave.com"]
header = "X-Subscription-Token"
format = "{}"

[[egress.secrets]]
name  = "tracker"
env   = "TRACKER_TOKEN"
hosts = ["mcp.tracker.example"]

[[egress.secrets]]
name  = "pypi"
env   = "PYPI_TOKEN"
hosts = ["pypi.example"]

[[agents]]
id = "ops"
provider = "local"
[agents.egress]
allow = ["pypi.example"]
[[agents.mcp]]
name           = "tracker"
url            = "https://mcp.tracker.example:8443/mcp"
headers_secret = "tracker"
[agents.web_search]
provider = "brave"
secret   = "brave"
`

func TestTheSearchAndMCPHostsAndTheirSecretsAreForTheAgentsOwnRequestsOnly(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, agentChannelConfig)
	host := facts(t, map[string]string{"BRAVE_KEY": "brave-key-value", "TRACKER_TOKEN": "tracker-token", "PYPI_TOKEN": "pypi-token"})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	e := p.Egress
	if e == nil {
		t.Fatal("no egress plan: the agent's own hosts need the proxy")
	}
	byTool := map[string]string{}
	for _, r := range e.Allow {
		byTool[r.Raw] = r.AgentTool
	}
	want := map[string]string{
		"pypi.example": "",
		"web_search: CONNECT api.search.brave.com:443":         "web_search",
		"MCP server tracker: CONNECT mcp.tracker.example:8443": "MCP server tracker",
	}
	for raw, tool := range want {
		if got, ok := byTool[raw]; !ok || got != tool {
			t.Errorf("allow %+v: want %q for %q", e.Allow, raw, tool)
		}
	}
	secrets := map[string]isolation.EgressSecret{}
	for _, s := range e.Secrets {
		secrets[s.Name] = s
	}
	if secrets["brave"].AgentTool != "web_search" || secrets["tracker"].AgentTool != "MCP server tracker" || secrets["pypi"].AgentTool != "" || len(secrets) != 3 {
		t.Errorf("secrets %+v: brave and tracker for the agent's own tools, pypi for every request", e.Secrets)
	}

	// The plan's judge (berthctl egress explain, the proxy) on each channel.
	tools := e.Judge(nil, nil)
	for _, u := range []string{"https://api.search.brave.com/res/v1/web/search", "https://mcp.tracker.example:8443/mcp"} {
		v, err := tools.Explain(context.Background(), egresspolicy.Question{Method: "GET", URL: u})
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed || !strings.Contains(v.Reason, "allowed for berth-agent's own") || !strings.Contains(v.Reason, "only") {
			t.Errorf("explain %s for a tool: %+v, want refused as the agent's own host", u, v)
		}
	}
	if sec := tools.SecretFor("api.search.brave.com", 443); sec != nil {
		t.Errorf("a tool's tunnel to the search host would get secret %s", sec.Name)
	}
	own := tools.OnAgentChannel()
	if d, ref := own.Destination(context.Background(), "CONNECT", "api.search.brave.com", 443); ref != nil || d.Rule.AgentTool != "web_search" {
		t.Errorf("the agent's own CONNECT to the search host: %+v %v", d, ref)
	}
	if sec := own.SecretFor("api.search.brave.com", 443); sec == nil || sec.Name != "brave" {
		t.Errorf("the agent's own tunnel to the search host gets secret %v, want brave", sec)
	}
	why, err := runplan.Explain(cfg, "ops", host)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(why.Why["egress"], "api.search.brave.com:443 for web_search only") || !strings.Contains(why.Why["egress"], "secret tracker for MCP server tracker only") {
		t.Errorf("sandbox explain's egress: %s", why.Why["egress"])
	}
}

// .mcp.json is the sandbox's to write: a server there reaches no host
// that only berth-agent's own rules allow.
func TestAWorkspaceMCPServerGetsNoneOfTheAgentsOwnHosts(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, agentChannelConfig)
	host := facts(t, map[string]string{"BRAVE_KEY": "b", "TRACKER_TOKEN": "t", "PYPI_TOKEN": "p"})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.Workspace, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Workspace, ".mcp.json"), []byte(`{"mcpServers": {"copy": {"type": "http", "url": "https://mcp.tracker.example:8443/mcp"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := cfg.Agent("ops")
	servers, refused := runplan.RunMCP(a, p)
	if slices.ContainsFunc(servers, func(s agentproto.MCPServer) bool { return s.Name == "copy" }) {
		t.Errorf("servers %+v: the workspace's copy of the tracker was taken", servers)
	}
	if len(refused) != 1 || !strings.Contains(refused[0].Error, "no [agents.egress] allow rule lets it reach mcp.tracker.example:8443") {
		t.Errorf("refused %+v, want the copy refused for want of an allow rule", refused)
	}
}
