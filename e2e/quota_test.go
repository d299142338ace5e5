package e2e

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/isolation/workspace"
)

// A run that fills its workspace meets ENOSPC at workspace_quota inside the
// sandbox, still ends with its reply, and what it wrote before is there for
// the next run.
func TestWorkspaceQuotaStopsAFullWorkspaceAtItsLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		container bool
	}{
		{"Host_run", false},
		{"Container_run", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			extra := `workspace_quota = "32m"`
			if tc.container {
				testdocker.Engine(t)
				extra += "\n" + containerAgent
			}
			agent := "quota-" + strings.ToLower(strings.Split(tc.name, "_")[0])
			s := start(t, []agentSpec{{id: agent, extra: extra}})
			t.Cleanup(func() {
				if err := workspace.Release(filepath.Join(s.StateDir, "scheduler", "workspaces")); err != nil {
					t.Errorf("cannot unmount the suite's workspaces: %v", err)
				}
			})

			id := s.mustPost(t, agent, "/sh echo kept > keep && dd if=/dev/zero of=big bs=1M count=64; du -m big")
			reply := s.sink.wait(t, 3*time.Minute, id)[id]
			got := text(reply)
			if reply["state"] != "succeeded" {
				t.Fatalf("a run that filled its workspace ended %v: %q (error %v)", reply["state"], got, reply["error"])
			}
			if !strings.Contains(got, "No space left on device") {
				t.Fatalf("reply %q: want dd to meet ENOSPC", got)
			}
			m := regexp.MustCompile(`(?m)^(\d+)\s+big$`).FindStringSubmatch(got)
			if m == nil {
				t.Fatalf("reply %q: no size of the file written", got)
			}
			if n, _ := strconv.Atoi(m[1]); n >= 32 || n < 16 {
				t.Fatalf("dd wrote %d MiB into a 32 MiB workspace", n)
			}

			// The scheduler still records runs, and the next run sees the file.
			id = s.mustPost(t, agent, "/sh cat keep; rm big")
			reply = s.sink.wait(t, 3*time.Minute, id)[id]
			if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "kept\n") || !strings.Contains(got, "[exit code 0]") {
				t.Fatalf("next run %v: %q; want the file written before the workspace filled", reply["state"], got)
			}
			if out, err := s.berthctl(t, "runs", "list", "--agent", agent); err != nil || strings.Count(out, "succeeded") != 2 {
				t.Fatalf("berthctl runs list: %v\n%s", err, out)
			}
		})
	}
}
