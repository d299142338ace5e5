package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/isolation"
)

// runInBackground starts s.Run and returns the channel its result arrives on.
func runInBackground(t *testing.T, s *Service) (cancel func(), done <-chan error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- s.Run(ctx) }()
	t.Cleanup(stop)
	return stop, ch
}

func waitRunResult(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s")
		return nil
	}
}

// waitProgressAt waits until s.LastProgress is at want.
func waitProgressAt(t *testing.T, s *Service, want time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.LastProgress().Equal(want) {
		if time.Now().After(deadline) {
			t.Fatalf("LastProgress = %s, want %s", s.LastProgress(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTheDispatcherReportsItsProgress(t *testing.T) {
	t.Parallel()
	t.Run("An_idle_dispatcher_passes_every_five_seconds", func(t *testing.T) {
		t.Parallel()
		clock := clockwork.NewFakeClock()
		s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil, withClock(clock))
		start(t, s)
		waitPass(t, s)
		for range 3 {
			clock.Advance(progressInterval)
			waitProgressAt(t, s, clock.Now())
		}
	})
	t.Run("A_dispatcher_stuck_on_the_store_stops_advancing_and_catches_up_once_free", func(t *testing.T) {
		t.Parallel()
		clock := clockwork.NewFakeClock()
		s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil, withClock(clock))
		start(t, s)
		waitPass(t, s)
		stuckAt := s.LastProgress()

		// A writer that never commits: the dispatcher's next claim waits on it.
		holding, release := make(chan struct{}), make(chan struct{})
		go s.store.db.Update(func(*bolt.Tx) error {
			close(holding)
			<-release
			return nil
		})
		<-holding
		for range 4 {
			clock.Advance(progressInterval)
		}
		if got := s.LastProgress(); !got.Equal(stuckAt) {
			t.Fatalf("LastProgress moved to %s while the dispatcher could not pass (stuck at %s)", got, stuckAt)
		}
		if lag := clock.Since(s.LastProgress()); lag < 4*progressInterval {
			t.Fatalf("a watchdog would see a lag of %s, want at least %s", lag, 4*progressInterval)
		}
		close(release)
		clock.Advance(progressInterval)
		waitProgressAt(t, s, clock.Now())
	})
}

func TestRunEndsWithAnErrorWhenItsWorkCannotGoOn(t *testing.T) {
	t.Parallel()
	t.Run("A_reconcile_that_cannot_read_the_store_makes_Run_return_the_reason", func(t *testing.T) {
		t.Parallel()
		s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
		if err := s.store.db.Close(); err != nil {
			t.Fatal(err)
		}
		_, done := runInBackground(t, s)
		err := waitRunResult(t, done)
		if err == nil || !strings.Contains(err.Error(), "cannot reconcile runs") {
			t.Fatalf("Run = %v, want a reconcile error", err)
		}
	})
	t.Run("A_store_that_fails_while_dispatching_ends_Run_with_an_error_and_stops_its_runs", func(t *testing.T) {
		t.Parallel()
		b := newGateBackend("landlock")
		s := newTestService(t, testConfig(4), "", b, nil)
		submit(t, s, "m1", "alpha")
		_, done := runInBackground(t, s)
		b.next(t)
		if err := s.store.db.Close(); err != nil {
			t.Fatal(err)
		}
		wake(s.wakeDispatch)
		err := waitRunResult(t, done)
		if err == nil || !strings.Contains(err.Error(), "cannot dispatch runs") {
			t.Fatalf("Run = %v, want a dispatch error", err)
		}
		if _, maxTotal, _ := b.stats(); maxTotal != 1 {
			t.Fatalf("max parallel = %d", maxTotal)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.total != 0 {
			t.Fatalf("%d runs still in their sandbox after Run returned; want them canceled", b.total)
		}
	})
	t.Run("A_run_whose_outcome_cannot_be_recorded_ends_Run_with_an_error", func(t *testing.T) {
		t.Parallel()
		b := newGateBackend("landlock")
		s := newTestService(t, testConfig(4), "", b, nil)
		submit(t, s, "m1", "alpha")
		_, done := runInBackground(t, s)
		run := b.next(t)
		// Take the store away without the dispatcher noticing first.
		s.mu.Lock()
		s.stopping = true // no more claims
		s.mu.Unlock()
		if err := s.store.db.Close(); err != nil {
			t.Fatal(err)
		}
		run.finish <- outcome{res: isolation.Result{}}
		err := waitRunResult(t, done)
		if err == nil || !strings.Contains(err.Error(), "cannot record the outcome") {
			t.Fatalf("Run = %v, want an error about the run's outcome", err)
		}
	})
}
