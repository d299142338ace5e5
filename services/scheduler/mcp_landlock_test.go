package scheduler

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// mcpServerBinary is the agent tests' stdio MCP server, built static into
// a directory the run user may enter.
var mcpServerBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "berth-scheduler-mcp-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		return "", err
	}
	return testenv.BuildStatic(dir, "mcpserver", "../../agent/testdata/mcpserver")
})

// A landlock run of the real berth-agent starts the agent's configured
// stdio MCP server inside its sandbox; the model (the local provider,
// scripted by the message) calls one of its tools, and the run's record
// shows each server's status, a failing one's error too.
func TestALandlockRunCallsAnMCPToolAndItsRecordShowsTheServers(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	bin, err := mcpServerBinary()
	if err != nil {
		t.Fatalf("cannot build the MCP server: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(bin)) })
	cfg := testConfig(1)
	cfg.Scheduler.AgentBinary = berthAgent(t)
	cfg.Agents[0].Provider = "local"
	// The server's program comes from the host's read set, which names it.
	cfg.Agents[0].FileAccess.AllowRead = []string{filepath.Dir(bin)}
	cfg.Agents[0].MCP = []config.MCPServer{
		{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"echo", "read"}},
		{Name: "tracker", Command: []string{bin, "exit"}},
	}
	stateDir := sharedStateDir(t)
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

	id := submit(t, s, "m1", "alpha", "text", `/tool mcp__files__echo {"text":"from the sandbox"}`)
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded || r.Reply != "[mcp__files__echo]\necho: from the sandbox" {
		t.Fatalf("run %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
	}
	if len(r.MCP) != 2 {
		t.Fatalf("the record's MCP servers = %+v, want files and tracker", r.MCP)
	}
	files, tracker := r.MCP[0], r.MCP[1]
	if files.Name != "files" || files.Transport != "stdio" || files.Error != "" || !slices.Equal(files.Tools, []string{"mcp__files__echo", "mcp__files__read"}) {
		t.Errorf("files = %+v, want stdio with echo and read, the entry's tools", files)
	}
	if tracker.Name != "tracker" || !strings.Contains(tracker.Error, "cannot open the issue database") {
		t.Errorf("tracker = %+v, want its error with the server's stderr", tracker)
	}

	servers, err := r.BusRun().MCPServers()
	if err != nil || len(servers) != 2 || servers[1].Error != tracker.Error {
		t.Errorf("GetRun's mcp = %+v, %v; want the record's two servers", servers, err)
	}
}
