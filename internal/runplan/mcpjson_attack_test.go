package runplan_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

// The sandbox writes .mcp.json and the scheduler reads it before each run
// of the agent: these are what a shell in one sandbox could put there.

func TestAWorkspacesMCPJSONCannotPointAServerAtTheSandboxesOwnProxy(t *testing.T) {
	t.Parallel()
	_, runMCP := workspaceMCPPlan(t, writeMCPJSON(t, `{"mcpServers": {
  "relay":    {"type": "http", "url": "http://127.0.0.1:3128/"},
  "relay6":   {"type": "http", "url": "http://[::1]:3128/"},
  "local":    {"url": "http://localhost:3128/mcp"},
  "control":  {"url": "https://mcp.tracker.example/issues"}
}}`))
	servers, refused := runMCP()
	if names := serverNames(servers); names != "files tracker control" {
		t.Errorf("servers = %s, want berth.toml's two and the control", names)
	}
	if len(refused) != 3 {
		t.Fatalf("refused %+v, want relay, relay6 and local", refused)
	}
	for _, r := range refused {
		if !strings.Contains(r.Error, "no [agents.egress] allow rule lets it reach") {
			t.Errorf("refusal of %s = %q, want it to name the missing allow rule", r.Name, r.Error)
		}
	}
}

func TestAWorkspacesMCPJSONHeadersOrEnvUnderAnotherSpellingAreRefusedAlike(t *testing.T) {
	t.Parallel()
	// encoding/json matches keys without regard to case: a spelling that
	// slipped past the check would still be decoded into the entry.
	_, runMCP := workspaceMCPPlan(t, writeMCPJSON(t, `{"mcpServers": {
  "upper":   {"url": "https://mcp.tracker.example/a", "HEADERS": {"Authorization": "Bearer sandbox"}},
  "mixed":   {"url": "https://mcp.tracker.example/b", "Headers": {"X": "y"}},
  "envy":    {"command": "mcp-notes", "ENV": {"LD_PRELOAD": "/workspace/evil.so"}},
  "control": {"command": "mcp-notes"}
}}`))
	servers, refused := runMCP()
	if names := serverNames(servers); names != "files tracker control" {
		t.Errorf("servers = %s, want berth.toml's two and the control", names)
	}
	if len(refused) != 3 {
		t.Errorf("refused %+v, want upper, mixed and envy", refused)
	}
	for _, r := range refused {
		if strings.Contains(r.Error, "sandbox") && strings.Contains(r.Error, "Bearer") {
			t.Errorf("a refusal repeats a header's value: %q", r.Error)
		}
	}
}

func TestAWorkspacesMCPJSONNestedDeeplyIsOneRecordLine(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	_, runMCP := workspaceMCPPlan(t, writeMCPJSON(t, `{"mcpServers": {"x": {"command": "y", "args": `+deep+`}}}`))
	servers, refused := runMCP()
	if names := serverNames(servers); names != "files tracker" || len(refused) != 1 || !strings.Contains(refused[0].Error, "cannot read .mcp.json") {
		t.Errorf("servers %s refused %+v; want berth.toml's two and one line", names, refused)
	}
}

func TestAWorkspacesMCPJSONWithTooManyServersAddsNoneAndIsOneRecordLine(t *testing.T) {
	t.Parallel()
	// 64 KiB holds thousands of entries: each accepted one is a process
	// started in every later run of the agent and tools offered to the
	// model; each refused one a line in every later run record.
	many := func(n int, entry string) string {
		var b strings.Builder
		b.WriteString(`{"mcpServers": {`)
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"s%d": %s`, i, entry)
		}
		b.WriteString("}}")
		return b.String()
	}
	tests := []struct {
		name      string
		text      string
		servers   string
		refusals  int
		refusedAs string
	}{
		{"Many_stdio_servers", many(1000, `{"command": "sleep", "args": ["infinity"]}`), "files tracker", 1, "more than"},
		{"Many_refused_servers", many(2000, `{"type": "sse"}`), "files tracker", 1, "more than"},
		{"Control_a_few_servers", many(3, `{"command": "mcp-notes"}`), "files tracker s0 s1 s2", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, runMCP := workspaceMCPPlan(t, writeMCPJSON(t, tc.text))
			servers, refused := runMCP()
			if names := serverNames(servers); names != tc.servers || len(refused) != tc.refusals {
				t.Fatalf("servers %s, %d refusals; want %s and %d", names, len(refused), tc.servers, tc.refusals)
			}
			if tc.refusals > 0 && !strings.Contains(refused[0].Error, tc.refusedAs) {
				t.Errorf("refusal = %q, want it to say %q", refused[0].Error, tc.refusedAs)
			}
		})
	}
}

func TestAWorkspacesMCPJSONMayBeALinkInsideTheWorkspaceButNotADirectory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		write   func(ws string)
		servers string
		line    string
	}{
		{"Control_a_link_to_a_file_in_the_workspace", func(ws string) {
			os.WriteFile(filepath.Join(ws, "mine.json"), []byte(`{"mcpServers": {"notes": {"command": "mcp-notes"}}}`), 0o600)
			os.Symlink("mine.json", filepath.Join(ws, ".mcp.json"))
		}, "files tracker notes", ""},
		{"A_link_that_climbs_out_through_dot_dot", func(ws string) {
			os.Symlink("../../../../../../../../etc/passwd", filepath.Join(ws, ".mcp.json"))
		}, "files tracker", "cannot read .mcp.json"},
		{"A_directory", func(ws string) {
			os.Mkdir(filepath.Join(ws, ".mcp.json"), 0o700)
		}, "files tracker", "cannot read .mcp.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, runMCP := workspaceMCPPlan(t, tc.write)
			servers, refused := runMCP()
			if names := serverNames(servers); names != tc.servers {
				t.Errorf("servers = %s, want %s", names, tc.servers)
			}
			if tc.line == "" && len(refused) != 0 || tc.line != "" && (len(refused) != 1 || !strings.Contains(refused[0].Error, tc.line)) {
				t.Errorf("refused %+v, want %q", refused, tc.line)
			}
		})
	}
}

func serverNames(servers []agentproto.MCPServer) string {
	var names []string
	for _, s := range servers {
		names = append(names, s.Name)
	}
	return strings.Join(names, " ")
}
