package runprep

import (
	"context"
	"os"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

const warmConfig = `
[scheduler]
run_as = "nobody"
agent_binary = "/nonexistent/berth-agent"

# These tests are about the preparation, not quotas (isolation/workspace).
[agent_defaults]
workspace_quota = "0"

[[agents]]
id = "hot"
[agents.container_mode]
enabled = true
warm = 1

[[agents]]
id = "cold"
[agents.container_mode]
enabled = true

[[agents]]
id = "host"
`

func TestWarmHandsThePoolsThePlansOfTheAgentsThatWarmAndNothingToTheOthers(t *testing.T) {
	t.Parallel()
	boxes := &recordingBackend{name: "container"}
	db := uidDB(t)
	p := New(Options{StateDir: t.TempDir(), Logger: quietLog, UIDs: db, Images: fakeImages{tag: "berth-agent-hot:1"},
		Backends: map[string]isolation.Backend{"container": boxes, "landlock": &recordingBackend{name: "landlock"}}})
	p.Warm(t.Context(), loadConfig(t, warmConfig))
	if len(boxes.warmed) != 1 || len(boxes.warmed[0]) != 1 {
		var agents [][]string
		for _, specs := range boxes.warmed {
			var ids []string
			for _, s := range specs {
				ids = append(ids, s.Plan.AgentID)
			}
			agents = append(agents, ids)
		}
		t.Fatalf("the pools were set %d times, for agents %v; want once, for hot", len(boxes.warmed), agents)
	}
	plan := boxes.warmed[0][0].Plan
	if plan.AgentID != "hot" || plan.Backend != isolation.BackendContainer || plan.Container.Image != "berth-agent-hot:1" || plan.Container.Warm != 1 {
		t.Errorf("warm plan of %q on %s with image %q, warm %d; want hot's container plan with its isolation image", plan.AgentID, plan.Backend, plan.Container.Image, plan.Container.Warm)
	}
	if os.Geteuid() == 0 {
		// The backend is learned without a plan: an agent that warms
		// nothing gets no uid for it.
		stored := storedUIDs(t, db)
		if _, ok := stored["hot"]; !ok || len(stored) != 1 {
			t.Errorf("uids allocated for %v; want hot's only", stored)
		}
	}
}

func TestWarmHandsNothingOnceTheSchedulerStops(t *testing.T) {
	t.Parallel()
	boxes := &recordingBackend{name: "container"}
	p := New(Options{StateDir: t.TempDir(), Logger: quietLog, UIDs: uidDB(t), Backends: map[string]isolation.Backend{"container": boxes}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	p.Warm(ctx, loadConfig(t, warmConfig))
	if len(boxes.warmed) != 0 {
		t.Fatalf("a stopping scheduler set the pools: %v", boxes.warmed)
	}
}
