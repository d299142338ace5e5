package scheduler

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEgressDirectoriesOfACrashedSchedulerAreRemovedAtStart(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	stale := filepath.Join(state, "egress", "run-of-a-dead-scheduler")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "egress.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(testConfig(1), state, Options{Getenv: func(string) string { return "" }, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.mu.Lock()
	s.active["live-run"] = &activeRun{}
	s.mu.Unlock()
	live := filepath.Join(state, "egress", "live-run")
	os.MkdirAll(live, 0o755)
	s.sweepOrphans(t.Context())
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead scheduler's egress directory is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a running run's egress directory was removed: %v", err)
	}
}
