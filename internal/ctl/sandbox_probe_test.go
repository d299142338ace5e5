package ctl

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// buildForRuns builds pkg static into a directory the run user may enter.
func buildForRuns(t *testing.T, name, pkg string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctl-bin-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := testenv.BuildStatic(dir, name, pkg)
	if err != nil {
		t.Fatalf("cannot build %s: %v", pkg, err)
	}
	return bin
}

func TestSandboxExplainProbeListsEachMCPServersToolsAskedThroughARun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t) // the landlock backend runs the agent as nobody
	agent := buildForRuns(t, "berth-agent", "../../cmd/berth-agent")
	server := buildForRuns(t, "mcpserver", "../../agent/testdata/mcpserver")
	conn, _ := schedulerOnBus(t, fmt.Sprintf(`[scheduler]
run_as = "nobody"
agent_uids = "off"
agent_binary = %q

[[agents]]
id = "ops"
provider = "local"
file_access = { allow_read = [%q] }
[[agents.mcp]]
name = "files"
command = [%q, "serve"]
tools = ["echo"]
[[agents.mcp]]
name = "tracker"
command = [%q, "exit"]
`, agent, filepath.Dir(server), server, server), nil)

	out, code := berthctl(conn, "sandbox", "explain", "--probe", "ops")
	if code != ExitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"mcp probe (each server asked through a real run):", "  files (stdio): mcp__files__echo\n", "  tracker (stdio): FAILED "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, code = berthctl(conn, "sandbox", "explain", "--json", "--probe", "ops")
	var got struct {
		Plan struct {
			AgentID string `json:"agent_id"`
		} `json:"plan"`
		MCPProbe []struct{ Name string } `json:"mcp_probe"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &got) != nil || len(got.MCPProbe) != 2 || got.MCPProbe[0].Name != "files" {
		t.Errorf("--json --probe: exit %d, decoded %+v:\n%s", code, got, out)
	}
}
