package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// ProbeMCP (berthctl sandbox explain --probe) asks the agent's servers for
// their tools through a real landlock run of berth-agent: a working
// server's tools, a failing one's error, the workspace's refused entry
// first; no run is recorded and no model called (the agent's provider is
// one nobody listens on).
func TestProbeMCPListsEachServersToolsThroughARealRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	bin, err := mcpServerBinary()
	if err != nil {
		t.Fatalf("cannot build the MCP server: %v", err)
	}
	cfg := testConfig(1)
	cfg.Scheduler.AgentBinary = berthAgent(t)
	// A model nobody serves, reached directly: a probe that called it would fail.
	cfg.Providers = config.Providers{Primary: "dead", Entries: map[string]config.Provider{
		"dead": {Name: "dead", Kind: "openai", Model: "m", BaseURL: "http://127.0.0.1:9/v1", APIKeyEnv: "DEAD_KEY"},
	}}
	cfg.Agents[0].Provider = "dead"
	cfg.Agents[0].FileAccess.AllowNetwork = new(true)
	cfg.Agents[0].FileAccess.AllowRead = []string{filepath.Dir(bin)}
	cfg.Agents[0].MCP = []config.MCPServer{
		{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"echo", "read"}},
		{Name: "tracker", Command: []string{bin, "exit"}},
	}
	stateDir := sharedStateDir(t)
	ws := filepath.Join(stateDir, "agents", "alpha")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, ".mcp.json"), []byte(`{"mcpServers": {"wiki": {"url": "https://wiki.example/mcp", "headers": {"X-Key": "k"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "unused-key" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	client := busapi.NewScheduler(b.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	servers, err := client.ProbeMCP(ctx, "alpha")
	if err != nil {
		t.Fatalf("ProbeMCP: %v", err)
	}
	if len(servers) != 3 {
		t.Fatalf("servers = %+v, want wiki refused, files and tracker", servers)
	}
	wiki, files, tracker := servers[0], servers[1], servers[2]
	if wiki.Name != "wiki" || !strings.Contains(wiki.Error, "headers are never taken from the workspace") {
		t.Errorf("wiki = %+v, want refused for its headers", wiki)
	}
	if files.Name != "files" || files.Error != "" || !slices.Equal(files.Tools, []string{"mcp__files__echo", "mcp__files__read"}) {
		t.Errorf("files = %+v, want its two tools", files)
	}
	if tracker.Name != "tracker" || !strings.Contains(tracker.Error, "cannot open the issue database") {
		t.Errorf("tracker = %+v, want its error with the server's stderr", tracker)
	}
	if runs, err := s.ListRuns(RunFilter{}); err != nil || len(runs) != 0 {
		t.Errorf("runs %+v, %v: a probe is not a run of the history", runs, err)
	}

	if _, err := client.ProbeMCP(ctx, "nope"); bus.ErrorName(err) != bus.ErrNotFound {
		t.Errorf("ProbeMCP of an unknown agent: %v, want %s", err, bus.ErrNotFound)
	}
}
