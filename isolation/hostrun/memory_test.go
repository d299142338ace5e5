package hostrun_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// The memory limit is defaulted once, in the config; a host run whose plan
// has none is refused, never given a default of the runner's own.
func TestAPlanWithoutAMemoryLimitIsRefused(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r-nolimit", AgentID: "a", Workspace: t.TempDir(), AgentBinary: "/bin/true",
		RunAs: "nobody", Timeout: time.Minute, Limits: isolation.Limits{Pids: 64}}}
	_, err := hostrun.Runner{}.Run(context.Background(), spec)
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "cannot run the plan of run r-nolimit (agent a): it has no memory limit") {
		t.Fatalf("Run: %v (reason %q); want the plan refused for its missing memory limit", err, isolation.ReasonOf(err))
	}
}
