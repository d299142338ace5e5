package container_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// The memory limit is defaulted once, in the config; a plan that reaches
// the backend without one is refused before the engine is asked anything,
// never run with a default of the backend's own.
func TestAPlanWithoutAMemoryLimitIsRefusedBeforeTheEngine(t *testing.T) {
	t.Parallel()
	b, err := container.New(container.Options{Client: hungEngine(t), Instance: t.TempDir(), EngineTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := isolation.Plan{RunID: "r-nolimit", AgentID: "a", Workspace: t.TempDir(), RunAs: "nobody", AgentBinary: "/bin/true",
		Network: isolation.Network{Mode: "none"}, Timeout: time.Minute, Limits: isolation.Limits{Pids: 256}}
	_, err = b.Run(context.Background(), isolation.Spec{Plan: p})
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "cannot run the plan of run r-nolimit (agent a): it has no memory limit") {
		t.Fatalf("Run: %v (reason %q); want the plan refused for its missing memory limit", err, isolation.ReasonOf(err))
	}
	c := b.Explain(p)
	if slices.ContainsFunc(c.Holds, func(h string) bool { return strings.HasPrefix(h, "Memory=") }) ||
		!slices.Contains(c.Missing, "Memory: the plan has no memory limit, so its runs are refused") {
		t.Errorf("Explain: holds %q, missing %q; want no Memory= line and the refusal named", c.Holds, c.Missing)
	}
}
