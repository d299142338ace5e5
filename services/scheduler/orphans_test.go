package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/isolation"
)

// attemptAtHold records, at each Hold point, the attempt the start was
// given and the one committed in scheduler.db at that moment.
type attemptAtHold struct {
	s      *Service
	mu     sync.Mutex
	given  []int
	stored []int
}

func (h *attemptAtHold) hold(_ context.Context, point, runID string, attempt int) {
	if point != HoldBeforeHandle {
		return
	}
	var stored Run
	_ = h.s.store.db.View(func(tx *bolt.Tx) error {
		stored, _, _ = getRun(tx, runID)
		return nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.given = append(h.given, attempt)
	h.stored = append(h.stored, stored.Attempt)
}

func TestEachStartHasAnAttemptOfItsOwnCommittedBeforeItMakesAnything(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	// As a crashed scheduler left it: running in its first attempt.
	writeRuns(t, dir, Run{ID: "r1", MessageID: "m-r1", Agent: "alpha", State: StateRunning,
		Backend: "landlock", Attempts: 1, Attempt: 1, Seq: 1, CreatedAt: now, StartedAt: now})
	b := newGateBackend("landlock")
	h := &attemptAtHold{}
	s := newTestService(t, testConfig(4), dir, b, nil, func(o *Options) { o.Hold = h.hold })
	h.s = s

	stop := start(t, s)
	if got := b.next(t).spec.Attempt; got != 2 {
		t.Fatalf("the start after the crash has plan attempt %d, want 2", got)
	}
	waitState(t, s, "r1", StateRunning)
	stop() // graceful: hands the attempt back (Attempts), not its number
	if r := waitState(t, s, "r1", StateQueued); r.Attempts != 1 || r.Attempt != 2 {
		t.Fatalf("after a graceful stop attempts = %d, attempt = %d; want 1 and 2", r.Attempts, r.Attempt)
	}
	start(t, s)
	third := b.next(t)
	if third.spec.Attempt != 3 {
		t.Fatalf("the start after the graceful stop has plan attempt %d, want 3: an attempt number is never used twice", third.spec.Attempt)
	}
	third.reply("done")
	waitState(t, s, "r1", StateSucceeded)

	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.given) != 2 || h.given[0] != 2 || h.given[1] != 3 || h.stored[0] != 2 || h.stored[1] != 3 {
		t.Fatalf("at each start's sandbox: given attempts %v, stored %v; want [2 3] both", h.given, h.stored)
	}
}

func TestEgressDirectoryOfADeadAttemptGoesWhileTheLiveAttemptKeepsItsOwn(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	s, err := New(testConfig(1), state, Options{Getenv: func(string) string { return "" }, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.mu.Lock()
	s.active["r1"] = &activeRun{attempt: 2}
	s.mu.Unlock()
	dead := filepath.Join(state, "egress", isolation.AttemptName("r1", 1))
	live := filepath.Join(state, "egress", isolation.AttemptName("r1", 2))
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.sweepOrphans(t.Context())
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead attempt's egress directory is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live attempt's egress directory was removed: %v", err)
	}
}

func TestAttemptNamesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		run     string
		attempt int
	}{
		{"20261201T113402_018006016_6bcbbdf01b-2", "20261201T113402_018006016_6bcbbdf01b", 2},
		{"20261201T113402_018006016_6bcbbdf01b", "20261201T113402_018006016_6bcbbdf01b", 0},
		{"stray-run", "stray-run", 0},
		{"r1-01", "r1-01", 0},
		{"r1-+1", "r1-+1", 0},
		{"r1-0", "r1-0", 0},
	} {
		if run, attempt := isolation.ParseAttemptName(tc.name); run != tc.run || attempt != tc.attempt {
			t.Errorf("ParseAttemptName(%q) = %q, %d; want %q, %d", tc.name, run, attempt, tc.run, tc.attempt)
		}
	}
	if got := isolation.AttemptName("r1", 3); got != "r1-3" {
		t.Errorf("AttemptName(r1, 3) = %q", got)
	}
}

// sweepingBackend is a gateBackend that is also a Sweeper: each sweep
// reports what live said of attempts 0 to 3 of the run the test watches.
type sweepingBackend struct {
	*gateBackend
	run    string
	sweeps chan [4]bool
}

func (b *sweepingBackend) Sweep(_ context.Context, live func(runID string, attempt int) bool) ([]string, error) {
	var said [4]bool
	for attempt := range said {
		said[attempt] = live(b.run, attempt)
	}
	b.sweeps <- said
	return nil, nil
}

func TestTheSweepRunsAtStartAndAgainEverySweepIntervalKeepingOnlyTheLiveAttempt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	writeRuns(t, dir, Run{ID: "r1", MessageID: "m-r1", Agent: "alpha", State: StateRunning,
		Backend: "landlock", Attempts: 1, Attempt: 1, Seq: 1, CreatedAt: now, StartedAt: now})
	clock := clockwork.NewFakeClock()
	b := &sweepingBackend{gateBackend: newGateBackend("landlock"), run: "r1", sweeps: make(chan [4]bool, 10)}
	s := newTestService(t, testConfig(4), dir, b.gateBackend, nil, withClock(clock), func(o *Options) {
		o.Backends = map[string]isolation.Backend{"landlock": b}
	})
	start(t, s)
	b.next(t) // attempt 2 runs and stays
	nextSweep := func(what string) [4]bool {
		t.Helper()
		select {
		case said := <-b.sweeps:
			return said
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30 s", what)
			return [4]bool{}
		}
	}
	nextSweep("sweep at start")
	clock.Advance(sweepInterval)
	// The first sweep may have run before attempt 2 was claimed; the one a
	// sweep interval later sees it.
	if said := nextSweep("sweep a sweep interval later"); said != [4]bool{false, false, true, false} {
		t.Fatalf("live said %v of attempts 0 to 3 while attempt 2 runs; want only attempt 2 live", said)
	}
}
