package container_test

import (
	"slices"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

// What the scheduler's warm pool series read: a run that finds no
// container waiting is a miss (it makes its own), one that takes a waiting
// container a hit, and the pool's size is the agent's warm setting.
func TestWarmPoolStatsCountARunThatFoundThePoolEmptyAndOneThatTookAWaitingContainer(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	drainOnCleanup(t, b)
	ws := workspace(t)
	warm := box{Warm: 1}
	var _ isolation.PoolReporter = b

	// Nobody called Warm: the first run finds no pool (it starts one) and
	// runs in a container of its own.
	first := spec(t, ws, "/sh true", warm)
	var handle string
	first.OnStart = func(h string) error { handle = h; return nil }
	mustRun(t, b, first)
	if got := b.PoolStats(); len(got) != 1 || got[0].Agent != "tester" || got[0].Size != 1 || got[0].Hits != 0 || got[0].Misses != 1 {
		t.Fatalf("after a run that found the pool empty: %+v, want tester: size 1, 0 hits, 1 miss", got)
	}

	waiting := waitWarm(t, cli, "one warm container", count(1))[0]
	waitPool(t, b, 1)
	if got := b.PoolStats(); got[0].Waiting != 1 {
		t.Fatalf("with a container waiting: %+v, want 1 waiting", got)
	}
	second := spec(t, ws, "/sh true", warm)
	second.OnStart = func(h string) error { handle = h; return nil }
	mustRun(t, b, second)
	if handle != "container:"+waiting.ID {
		t.Fatalf("the second run used %s, want the waiting container %s", handle, waiting.ID)
	}
	got := b.PoolStats()
	if i := slices.IndexFunc(got, func(s isolation.PoolStat) bool { return s.Agent == "tester" }); i < 0 || got[i].Hits != 1 || got[i].Misses != 1 {
		t.Fatalf("after a run that took a waiting container: %+v, want 1 hit and 1 miss", got)
	}
}
