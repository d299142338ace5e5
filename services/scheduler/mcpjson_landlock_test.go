package scheduler

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// A stdio server in the workspace's .mcp.json is started inside a real
// landlock run and its tool called; an entry with headers never reaches the
// sandbox, and the run's record says why.
func TestALandlockRunUsesItsWorkspacesMCPJSONAndItsRecordSaysWhatWasRefused(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	bin, err := mcpServerBinary()
	if err != nil {
		t.Fatalf("cannot build the MCP server: %v", err)
	}
	cfg := testConfig(1)
	cfg.Scheduler.AgentBinary = berthAgent(t)
	cfg.Agents[0].Provider = "local"
	cfg.Agents[0].FileAccess.AllowRead = []string{filepath.Dir(bin)}
	cfg.Agents[0].MCP = []config.MCPServer{{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"read"}}}
	stateDir := sharedStateDir(t)
	ws := filepath.Join(stateDir, "agents", "alpha")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	mcpJSON := fmt.Sprintf(`{"mcpServers": {
  "notes": {"command": %q, "args": ["serve"]},
  "files": {"command": %q, "args": ["exit"]},
  "tracker": {"type": "http", "url": "https://mcp.tracker.example/mcp", "headers": {"Authorization": "Bearer workspace-written"}}
}}`, bin, bin)
	if err := os.WriteFile(filepath.Join(ws, ".mcp.json"), []byte(mcpJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	id := submit(t, s, "m1", "alpha", "text", `/tool mcp__notes__echo {"text":"from .mcp.json"}`)
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded || r.Reply != "[mcp__notes__echo]\necho: from .mcp.json" {
		t.Fatalf("run %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
	}
	byName := map[string]int{}
	for i, m := range r.MCP {
		byName[m.Name] = i
	}
	if len(r.MCP) != 3 {
		t.Fatalf("the record's MCP servers = %+v, want tracker refused, files and notes", r.MCP)
	}
	// berth.toml's files wins over the workspace's (which would exit).
	if files := r.MCP[byName["files"]]; files.Error != "" || !slices.Equal(files.Tools, []string{"mcp__files__read"}) {
		t.Errorf("files = %+v, want berth.toml's entry with its one tool", files)
	}
	if tracker := r.MCP[byName["tracker"]]; !strings.Contains(tracker.Error, "headers are never taken from the workspace") {
		t.Errorf("tracker = %+v, want it refused for its headers", tracker)
	}
	if strings.Contains(r.StderrTail+r.Error+fmt.Sprint(r.MCP), "workspace-written") {
		t.Error("the header's value from .mcp.json is in the run record")
	}
}
