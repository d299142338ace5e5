package confine

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestToolPolicyLeavesOutTheAgentsProcEntry(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	own := fmt.Sprintf("/proc/%d", os.Getpid())
	tests := []struct {
		name      string
		allowRead []string
		wantKept  string // a rule the tools keep, "" for none to check
	}{
		{"Proc_self_is_dropped", []string{"/usr", "/proc/self", "/proc/cpuinfo"}, "/proc/cpuinfo"},
		{"Proc_thread_self_is_dropped", []string{"/usr", "/proc/thread-self"}, "/usr"},
		{"Proc_as_a_whole_is_split_around_the_agent", []string{"/proc"}, "/proc/1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			agent := agentproto.Policy{AllowRead: tc.allowRead, Deny: []string{"/usr/share/doc"}}
			tools := ToolPolicy(agent, os.Getpid())
			if len(agent.Deny) != 1 {
				t.Errorf("ToolPolicy changed the agent's policy: %v", agent.Deny)
			}
			agentRules, err := Plan(agent.AllowRead, agent.AllowReadWrite, agent.Deny, quiet)
			if err != nil {
				t.Fatal(err)
			}
			if !reaches(agentRules, own) {
				t.Fatalf("the agent's own rules do not reach %s: %+v", own, agentRules)
			}
			rules, err := Plan(tools.AllowRead, tools.AllowReadWrite, tools.Deny, quiet)
			if err != nil {
				t.Fatal(err)
			}
			if reaches(rules, own) {
				t.Errorf("the tools' rules reach the agent's %s", own)
			}
			if tc.wantKept != "" && !reaches(rules, tc.wantKept) {
				t.Errorf("the tools lost %s", tc.wantKept)
			}
		})
	}
}

// reaches reports whether a rule grants path or something beneath it.
func reaches(rules []Rule, path string) bool {
	for _, r := range rules {
		if r.Path == path || strings.HasPrefix(r.Path, path+"/") || strings.HasPrefix(path, r.Path+"/") {
			return true
		}
	}
	return false
}
