package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

const trackerSecret = `
[[egress.secrets]]
name   = "tracker"
env    = "TRACKER_TOKEN"
hosts  = ["mcp.tracker.example"]
paths  = ["/mcp"]
`

const braveSecret = `
[[egress.secrets]]
name   = "brave"
env    = "BRAVE_API_KEY"
hosts  = ["api.search.brave.com"]
header = "X-Subscription-Token"
format = "{}"
methods = ["GET"]
paths  = ["/res/v1/web/search"]
`

func TestMCPServersAndWebSearchResolveFromTheAgentElseTheDefaults(t *testing.T) {
	t.Parallel()
	c := load(t, trackerSecret+braveSecret+`
[agent_defaults]
[[agent_defaults.mcp]]
name    = "files"
command = ["mcp-server-filesystem", "/workspace/docs"]
[agent_defaults.web_search]
provider = "brave"
secret   = "brave"
[agent_defaults.egress]
allow = ["api.search.brave.com"]

[[agents]]
id = "plain"

[[agents]]
id = "own"
[agents.egress]
allow = ["mcp.tracker.example:443", "search.internal.example"]
[[agents.mcp]]
name           = "tracker"
url            = "https://mcp.tracker.example/mcp"
headers_secret = "tracker"
tools          = ["search_issues", "get_issue"]
timeout        = "45s"
[agents.web_search]
provider = "searxng"
base_url = "http://search.internal.example"

[[agents]]
id  = "none"
mcp = []
`)
	plain, _ := c.Agent("plain")
	wantFiles := []config.MCPServer{{Name: "files", Command: []string{"mcp-server-filesystem", "/workspace/docs"}}}
	if !reflect.DeepEqual(plain.MCP, wantFiles) {
		t.Errorf("plain's MCP = %+v, want [agent_defaults]' %+v", plain.MCP, wantFiles)
	}
	if want := (&config.WebSearch{Provider: "brave", BaseURL: config.DefaultBraveBaseURL, Secret: "brave"}); !reflect.DeepEqual(plain.WebSearch, want) {
		t.Errorf("plain's web search = %+v, want %+v (brave's base_url defaulted)", plain.WebSearch, want)
	}

	own, _ := c.Agent("own")
	timeout := config.Duration(45 * time.Second)
	wantTracker := []config.MCPServer{{Name: "tracker", URL: "https://mcp.tracker.example/mcp", HeadersSecret: "tracker", Tools: []string{"search_issues", "get_issue"}, Timeout: &timeout}}
	if !reflect.DeepEqual(own.MCP, wantTracker) {
		t.Errorf("own's MCP = %+v, want its own list, which replaces the defaults' whole: %+v", own.MCP, wantTracker)
	}
	if want := (&config.WebSearch{Provider: "searxng", BaseURL: "http://search.internal.example"}); !reflect.DeepEqual(own.WebSearch, want) {
		t.Errorf("own's web search = %+v, want %+v", own.WebSearch, want)
	}

	if none, _ := c.Agent("none"); none.MCP != nil {
		t.Errorf("mcp = [] gave %+v, want no server (the defaults' replaced)", none.MCP)
	}
}

func TestMCPServersAndWebSearchRefuseWhatWouldNotWorkNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	agent := "[[agents]]\nid = \"ops\"\n"
	allowTracker := "[agents.egress]\nallow = [\"mcp.tracker.example:443\"]\n"
	for _, tc := range []struct{ name, toml, want string }{
		{"A name with a double underscore",
			agent + "[[agents.mcp]]\nname = \"a__b\"\ncommand = [\"x\"]\n",
			`berth.toml:4: agents[0].mcp[0].name: "a__b" is not an MCP server name: use 1 to 32 letters, digits, '-' or single '_'`},
		{"A name longer than 32",
			agent + "[[agents.mcp]]\nname = \"" + strings.Repeat("a", 33) + "\"\ncommand = [\"x\"]\n",
			"is not an MCP server name"},
		{"No name",
			agent + "[[agents.mcp]]\ncommand = [\"x\"]\n",
			"berth.toml:3: agents[0].mcp[0].name: is required"},
		{"The same name twice",
			agent + "[[agents.mcp]]\nname = \"a\"\ncommand = [\"x\"]\n[[agents.mcp]]\nname = \"a\"\ncommand = [\"y\"]\n",
			`berth.toml:7: agents[0].mcp[1].name: MCP server "a" is already defined on line 4`},
		{"Both command and url",
			agent + allowTracker + "[[agents.mcp]]\nname = \"a\"\ncommand = [\"x\"]\nurl = \"https://mcp.tracker.example/mcp\"\n",
			"berth.toml:5: agents[0].mcp[0]: set exactly one of command (a stdio server, started inside the sandbox) and url"},
		{"Neither command nor url",
			agent + "[[agents.mcp]]\nname = \"a\"\n",
			"agents[0].mcp[0]: set exactly one of command"},
		{"An empty command",
			agent + "[[agents.mcp]]\nname = \"a\"\ncommand = []\n",
			"berth.toml:5: agents[0].mcp[0].command: name the program to run"},
		{"A bad tool name",
			agent + "[[agents.mcp]]\nname = \"a\"\ncommand = [\"x\"]\ntools = [\"ok\", \"no spaces\"]\n",
			`berth.toml:6: agents[0].mcp[0].tools[1]: "no spaces" is not a tool name`},
		{"A timeout too short",
			agent + "[[agents.mcp]]\nname = \"a\"\ncommand = [\"x\"]\ntimeout = \"10ms\"\n",
			"berth.toml:6: agents[0].mcp[0].timeout: must be a length of time from 1s to 1h0m0s, not 10ms"},
		{"Credentials in the URL",
			agent + allowTracker + "[[agents.mcp]]\nname = \"a\"\nurl = \"https://bob:hunter2@mcp.tracker.example/mcp\"\n",
			"agents[0].mcp[0].url: \"https://%E2%80%A6@mcp.tracker.example/mcp\" holds credentials: put them in an [[egress.secrets]] entry"},
		{"A URL of an agent with a direct network",
			agent + "[agents.file_access]\nallow_network = true\n[[agents.mcp]]\nname = \"a\"\nurl = \"https://mcp.tracker.example/mcp\"\n",
			`agents[0].mcp[0].url: MCP server a is reached only through the egress proxy, which agent "ops"'s runs do not have (file_access.allow_network = true)`},
		{"A headers_secret that is not defined",
			agent + allowTracker + "[[agents.mcp]]\nname = \"a\"\nurl = \"https://mcp.tracker.example/mcp\"\nheaders_secret = \"nope\"\n",
			`berth.toml:8: agents[0].mcp[0].headers_secret: secret "nope" is not an [[egress.secrets]] entry (defined: none)`},
		{"A headers_secret for another host",
			trackerSecret + agent + "[agents.egress]\nallow = [\"other.example\"]\n[[agents.mcp]]\nname = \"a\"\nurl = \"https://other.example/mcp\"\nheaders_secret = \"tracker\"\n",
			`secret "tracker" is not for host other.example of MCP server a: add it to the secret's hosts (mcp.tracker.example)`},
		{"A headers_secret over plain http",
			trackerSecret + agent + "[agents.egress]\nallow = [\"POST mcp.tracker.example:80\"]\n[[agents.mcp]]\nname = \"a\"\nurl = \"http://mcp.tracker.example/mcp\"\nheaders_secret = \"tracker\"\n",
			`MCP server a must be reached over https to get secret "tracker"`},
		{"A headers_secret whose paths miss the URL",
			trackerSecret + agent + allowTracker + "[[agents.mcp]]\nname = \"a\"\nurl = \"https://mcp.tracker.example/api\"\nheaders_secret = \"tracker\"\n",
			`secret "tracker" is not added under path /api of MCP server a: its paths are [/mcp]`},
		{"A headers_secret on a stdio server",
			trackerSecret + agent + "[[agents.mcp]]\nname = \"a\"\ncommand = [\"x\"]\nheaders_secret = \"tracker\"\n",
			"agents[0].mcp[0].headers_secret: is for a server reached by url"},
		{"A bad server of [agent_defaults]",
			"[[agent_defaults.mcp]]\nname = \"a\"\n" + agent,
			"berth.toml:1: agent_defaults.mcp[0]: set exactly one of command"},
		{"A search provider berth does not know",
			agent + "[agents.web_search]\nprovider = \"bing\"\n",
			`berth.toml:4: agents[0].web_search.provider: "bing" is not one of searxng, brave`},
		{"A search table without provider",
			agent + "[agents.web_search]\nbase_url = \"https://search.example\"\n",
			"agents[0].web_search.provider: is required: searxng or brave"},
		{"SearXNG without base_url",
			agent + "[agents.web_search]\nprovider = \"searxng\"\n",
			"agents[0].web_search.base_url: is required for provider searxng"},
		{"A search secret whose paths miss the search",
			"[[egress.secrets]]\nname = \"s\"\nenv = \"K\"\nhosts = [\"search.example\"]\npaths = [\"/api\"]\n" + agent + "[agents.egress]\nallow = [\"search.example\"]\n[agents.web_search]\nprovider = \"searxng\"\nbase_url = \"https://search.example/\"\nsecret = \"s\"\n",
			`secret "s" is not added under path /search of web_search (searxng): its paths are [/api]`},
		{"Brave without its secret",
			agent + "[agents.egress]\nallow = [\"api.search.brave.com\"]\n[agents.web_search]\nprovider = \"brave\"\n",
			`agents[0].web_search.secret: is required for provider brave: name an [[egress.secrets]] entry for api.search.brave.com with header = "X-Subscription-Token" and format = "{}"`},
		{"Brave with a secret in the wrong header",
			"[[egress.secrets]]\nname = \"brave\"\nenv = \"K\"\nhosts = [\"api.search.brave.com\"]\n" + agent + "[agents.egress]\nallow = [\"api.search.brave.com\"]\n[agents.web_search]\nprovider = \"brave\"\nsecret = \"brave\"\n",
			`berth.toml:11: agents[0].web_search.secret: secret "brave" must have header = "X-Subscription-Token" and format = "{}"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tc.toml})
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("loaded; want an error containing %q", tc.want)
			}
			if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tc.want) {
				t.Fatalf("errors = %s\nwant one containing %q", got, tc.want)
			}
		})
	}
}

func TestAnErrorOfADefaultsServerIsReportedOnceForAllAgents(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": "[[agent_defaults.mcp]]\nname = \"a\"\n[[agents]]\nid = \"one\"\n[[agents]]\nid = \"two\"\n"})
	_, err := config.Load(path)
	if got := errorLines(t, err, path); len(got) != 1 {
		t.Fatalf("errors = %q, want the defaults' one error once", got)
	}
}
