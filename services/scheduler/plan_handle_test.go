package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// A sandbox whose handle the store did not take could not be killed after a
// scheduler crash: the run ends at once, with a reason, instead of running
// on as a possible orphan.
func TestARunWhoseHandleCannotBeRecordedEndsAtOnce(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cfg := testConfig(4)
	cfg.Scheduler.AgentBinary = testAgent(t)
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// The run is not in scheduler.db, so recording its handle fails.
	r := Run{ID: "r-unrecorded", MessageID: "m1", Agent: "alpha", Text: "sleep", CreatedAt: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, backend, err := s.runOnce(ctx, r, cfg)
	if isolation.ReasonOf(err) != isolation.ReasonUntracked || !strings.Contains(err.Error(), "not in "+DBName) {
		t.Fatalf("runOnce = %v, want reason %q saying why", err, isolation.ReasonUntracked)
	}
	// The agent sleeps for an hour unless killed; runOnce returns only once
	// it has ended.
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the untracked run took %s to end", took)
	}
	if backend != landlock.Name {
		t.Errorf("backend = %q", backend)
	}
}
