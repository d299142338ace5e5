package runplan_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// workspaceMCPPlan compiles a run of mcpConfig's ops, has write fill its
// workspace, and returns the plan and the run's RunMCP.
func workspaceMCPPlan(t *testing.T, write func(workspace string)) (isolation.Plan, func() ([]agentproto.MCPServer, []agentproto.MCPStatus)) {
	t.Helper()
	cfg := loadConfig(t, mcpConfig)
	host := facts(t, map[string]string{"TRACKER_TOKEN": "tracker-token-value", "BRAVE_KEY": "brave-key-value"})
	p, err := runplan.Compile(cfg, "ops", "r1", host)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.Workspace, 0o700); err != nil {
		t.Fatal(err)
	}
	write(p.Workspace)
	a, _ := cfg.Agent("ops")
	return p, func() ([]agentproto.MCPServer, []agentproto.MCPStatus) { return runplan.RunMCP(a, p) }
}

func writeMCPJSON(t *testing.T, text string) func(string) {
	return func(ws string) {
		if err := os.WriteFile(filepath.Join(ws, ".mcp.json"), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAWorkspacesMCPJSONAddsServersCheckedAsBerthTomlsAndNeverItsHeaders(t *testing.T) {
	t.Parallel()
	_, runMCP := workspaceMCPPlan(t, writeMCPJSON(t, `{"mcpServers": {
  "notes":   {"command": "mcp-notes", "args": ["--dir", "/workspace/notes"]},
  "issues":  {"type": "http", "url": "https://mcp.tracker.example/issues"},
  "leaky":   {"type": "http", "url": "https://mcp.tracker.example/mcp", "headers": {"Authorization": "Bearer from-the-sandbox"}},
  "elsewhere": {"url": "https://evil.example/mcp"},
  "both":    {"command": "x", "url": "https://mcp.tracker.example/x"},
  "files":   {"command": "not-the-admins"}
}}`))
	servers, refused := runMCP()
	want := []agentproto.MCPServer{
		{Name: "files", Command: []string{"mcp-files", "/workspace/docs"}, Tools: []string{"read"}, TimeoutSeconds: 2}, // berth.toml's wins
		{Name: "tracker", URL: "https://mcp.tracker.example/mcp"},
		{Name: "issues", URL: "https://mcp.tracker.example/issues", Workspace: true},
		{Name: "notes", Command: []string{"mcp-notes", "--dir", "/workspace/notes"}, Workspace: true},
	}
	if !reflect.DeepEqual(servers, want) {
		t.Errorf("servers = %+v\nwant %+v", servers, want)
	}
	why := map[string]string{}
	for _, r := range refused {
		why[r.Name] = r.Error
	}
	for name, part := range map[string]string{
		"leaky":     "headers are never taken from the workspace",
		"elsewhere": `no [agents.egress] allow rule lets it reach evil.example:443`,
		"both":      "set exactly one of command",
	} {
		if !strings.Contains(why[name], part) || !strings.HasPrefix(why[name], `.mcp.json server "`+name+`" refused: `) {
			t.Errorf("refusal of %s = %q, want it to say %q", name, why[name], part)
		}
	}
	if len(refused) != 3 {
		t.Errorf("refused %+v, want leaky, elsewhere and both", refused)
	}
	for _, r := range refused {
		if strings.Contains(r.Error, "from-the-sandbox") {
			t.Errorf("a refusal repeats the header's value: %q", r.Error)
		}
	}
}

func TestAWorkspacesMCPJSONThatCannotBeReadIsOneRecordLine(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "admin.json")
	os.WriteFile(outside, []byte(`{"mcpServers": {"x": {"command": "y"}}}`), 0o600)
	tests := []struct {
		name  string
		write func(t *testing.T) func(string)
		want  string
	}{
		{"A_symbolic_link_out_of_the_workspace", func(t *testing.T) func(string) {
			return func(ws string) { os.Symlink(outside, filepath.Join(ws, ".mcp.json")) }
		}, "cannot read .mcp.json"},
		{"A_file_over_64_KiB", func(t *testing.T) func(string) {
			return writeMCPJSON(t, `{"mcpServers": {}, "pad": "`+strings.Repeat("x", 64<<10)+`"}`)
		}, "larger than 64 KiB"},
		{"A_FIFO_that_would_block_a_reader", func(t *testing.T) func(string) {
			return func(ws string) { syscall.Mkfifo(filepath.Join(ws, ".mcp.json"), 0o600) }
		}, "not a regular file"},
		{"Garbage", func(t *testing.T) func(string) { return writeMCPJSON(t, `{"mcpServers": [`) }, "cannot read .mcp.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, runMCP := workspaceMCPPlan(t, tc.write(t))
			servers, refused := runMCP()
			if len(servers) != 2 || len(refused) != 1 || !strings.Contains(refused[0].Error, tc.want) {
				t.Errorf("servers %+v refused %+v; want berth.toml's two and one line saying %q", servers, refused, tc.want)
			}
		})
	}
}

func TestAWorkspaceWithoutMCPJSONHasBerthTomlsServersOnly(t *testing.T) {
	t.Parallel()
	_, runMCP := workspaceMCPPlan(t, func(string) {})
	if servers, refused := runMCP(); len(servers) != 2 || refused != nil {
		t.Errorf("servers %+v refused %+v; want berth.toml's two and no line", servers, refused)
	}
}
