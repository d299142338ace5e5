package scheduler

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// A landlock run's stdio MCP server (in the sandbox, under the tools'
// confinement) gives the model its resources and prompts as tools, as far
// as the entry's tools allow; a read that hangs is a tool error in the
// run's record after the entry's timeout, not a hung run.
func TestALandlockRunReadsAnMCPResourceAndGetsAPromptFromItsStdioServer(t *testing.T) {
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
	// Long enough for a start on a busy machine, short for the hang.
	timeout := config.Duration(5 * time.Second)
	cfg.Agents[0].MCP = []config.MCPServer{
		{Name: "notes", Command: []string{bin, "serve"}, Tools: []string{"echo", "read_resource", "get_prompt"}, Timeout: &timeout},
	}
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	for i, c := range []struct{ text, reply string }{
		{`/tool mcp__notes__read_resource {"uri":"notes://readme"}`, "[mcp__notes__read_resource]\nberth notes: the walls hold"},
		{`/tool mcp__notes__get_prompt {"name":"summarise","arguments":{"topic":"walls"}}`, "[mcp__notes__get_prompt]\nA summary\nuser: Summarise walls in one line."},
	} {
		r := waitFinishedWithin(t, s, submit(t, s, "m"+string(rune('a'+i)), "alpha", "text", c.text), 2*time.Minute)
		if r.State != StateSucceeded || r.Reply != c.reply {
			t.Errorf("run %s %s: reply %q, want %q; error %q, stderr %q", r.ID, r.State, r.Reply, c.reply, r.Error, r.StderrTail)
		}
		if len(r.MCP) != 1 || !slices.Equal(r.MCP[0].Tools, []string{"mcp__notes__echo", "mcp__notes__read_resource", "mcp__notes__get_prompt"}) {
			t.Errorf("the record's MCP line = %+v, want echo and the entry's resource and prompt tools (no list_resources)", r.MCP)
		}
	}
	r := waitFinishedWithin(t, s, submit(t, s, "slow", "alpha", "text", `/tool mcp__notes__read_resource {"uri":"notes://slow"}`), 2*time.Minute)
	if r.State != StateSucceeded || !strings.Contains(string(r.ToolCalls), "MCP server notes failed on read_resource: no answer within 5s") {
		t.Errorf("a read that hangs: run %s, reply %q, tool calls %s; want the timeout as the call's error in the record", r.State, r.Reply, r.ToolCalls)
	}
}
