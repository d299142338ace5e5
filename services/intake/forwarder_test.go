package intake

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// acceptBacklog stores n pending messages of connector hooks, ids m-0000…,
// for 100 agents in turn (one agent's Submits are made one at a time), and
// returns their ids oldest first.
func acceptBacklog(t *testing.T, s *Service, n int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make(chan error, n)
	for i := range n {
		ids[i] = fmt.Sprintf("m-%04d", i)
	}
	for i, id := range ids {
		go func() {
			_, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: id, Channel: "ops", Author: "ada", Text: "hi", Agent: fmt.Sprintf("agent-%02d", i%100), ReceivedAt: time.Now()})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Concurrent accepts share commits and arrive in any order: read the
	// order the pending index holds.
	pending, err := s.store.pendingMessagesOf("hooks")
	if err != nil || len(pending) != n {
		t.Fatalf("pending = %d messages (%v), want %d", len(pending), err, n)
	}
	for i, m := range pending {
		ids[i] = m.ID
	}
	return ids
}

func TestABacklogIsHandedOnWithManySubmitsInFlightAndMarkedInSharedCommits(t *testing.T) {
	t.Parallel()
	sub := newCountingSubmitter()
	s, _ := newTestService(t, testConfig(""), WithSubmitter(sub))
	const n = 300
	ids := acceptBacklog(t, s, n)
	before, _ := s.store.commitStats()

	gate := holdCommits(t, s)
	runService(t, s)
	gate.waitEntered(t) // the first message's submitted mark
	// A worker that waited for each Submit and its commit before the next
	// would never get here: the other Submits of the window have returned
	// and their marks wait for the commit after the first.
	// Each agent's messages are handed on one at a time: the window's
	// Submits that return are those of its distinct agents.
	pending, err := s.store.pendingMessagesOf("hooks")
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]bool{}
	for _, m := range pending[:submitWindow] {
		agents[m.Agent] = true
	}
	eventually(t, "every Submit of the window's distinct agents has returned", func() bool {
		return sub.totalCalls() == len(agents)
	})
	s.store.w.SetCommitHook(nil)
	gate.release <- nil
	eventually(t, "the backlog is submitted", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })

	for _, id := range ids {
		if calls := sub.callsFor("hooks/" + id); calls != 1 {
			t.Fatalf("%s was submitted %d times, want 1", id, calls)
		}
		m, _, err := s.store.message("hooks", id)
		if err != nil || m.State != stateSubmitted || m.RunID == "" || m.Attempts != 1 {
			t.Fatalf("%s is stored as %+v (%v), want submitted with its run id", id, m, err)
		}
	}
	after, _ := s.store.commitStats()
	if marks := after - before; marks >= n-submitWindow+2 {
		t.Fatalf("%d submitted marks took %d commits, want them to share commits", n, marks)
	}
}

func TestWhileTheSchedulerIsDownRetriesWriteNothingAndTouchOnlyTheOldestMessages(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	sub := newCountingSubmitter()
	sub.failing = true
	s, _ := newTestService(t, testConfig(""), WithSubmitter(sub), WithClock(clock))
	const n = 500
	ids := acceptBacklog(t, s, n)
	accepted, _ := s.store.commitStats()
	passes := passHook(s)
	runService(t, s)

	const retryPeriods = 20
	for range retryPeriods {
		passes.waitFor(t, "forward/hooks")
		clock.Advance(time.Second) // past the longest retry delay (100ms here)
	}
	passes.waitFor(t, "forward/hooks")
	if commits, _ := s.store.commitStats(); commits != accepted {
		t.Fatalf("%d retry periods with the scheduler down took %d commits, want none", retryPeriods, commits-accepted)
	}
	tried := 0
	for _, id := range ids {
		if sub.callsFor("hooks/"+id) > 0 {
			tried++
		}
	}
	if tried == 0 || tried > submitWindow {
		t.Fatalf("the retries tried %d different messages, want the oldest (at most %d)", tried, submitWindow)
	}
	if calls := sub.callsFor("hooks/" + ids[n-1]); calls != 0 {
		t.Fatalf("the newest message was tried %d times while the scheduler was down, want 0", calls)
	}
	if attempts, lastErr := s.submitFailures("hooks", ids[0]); attempts < 2 || lastErr == "" {
		t.Fatalf("the oldest message failed %d times (%q), want it retried with the error", attempts, lastErr)
	}

	sub.mu.Lock()
	sub.failing = false
	sub.mu.Unlock()
	clock.Advance(time.Second)
	eventually(t, "the backlog is submitted once the scheduler is back", func() bool {
		in, _ := s.store.pendingCounts()
		if in != 0 {
			clock.Advance(time.Second)
		}
		return in == 0
	})
	commits, _ := s.store.commitStats()
	if perMessage := float64(commits) / n; perMessage > 2 {
		t.Fatalf("accepting, retrying and submitting took %.2f commits per message, want at most 2", perMessage)
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.runs) != n {
		t.Fatalf("the scheduler has %d runs, want %d", len(sub.runs), n)
	}
}

// orderSubmitter records the order of Submits and how many of one agent were
// ever in flight at once.
type orderSubmitter struct {
	mu          sync.Mutex
	order       []string
	inFlight    map[string]int
	maxInFlight int
}

func (o *orderSubmitter) Submit(_ context.Context, msg map[string]string) (string, error) {
	o.mu.Lock()
	o.inFlight[msg["agent"]]++
	o.maxInFlight = max(o.maxInFlight, o.inFlight[msg["agent"]])
	o.order = append(o.order, msg["id"])
	o.mu.Unlock()
	runtime.Gosched() // give a second Submit of the agent its chance to overlap
	o.mu.Lock()
	o.inFlight[msg["agent"]]--
	o.mu.Unlock()
	return "run-" + msg["id"], nil
}

func TestOneAgentsMessagesAreHandedOnOneAtATimeInArrivalOrder(t *testing.T) {
	t.Parallel()
	sub := &orderSubmitter{inFlight: map[string]int{}}
	s, _ := newTestService(t, testConfig(""), WithSubmitter(sub))
	var ids []string
	for i := range 40 {
		id := fmt.Sprintf("o-%02d", i)
		if _, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: id, Channel: "ops", Author: "ada", Text: "hi", Agent: "ops-agent", ReceivedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, "hooks/"+id)
	}
	runService(t, s)
	eventually(t, "the backlog is submitted", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.maxInFlight != 1 {
		t.Errorf("%d Submits of one agent were in flight at once, want 1", sub.maxInFlight)
	}
	if !slices.Equal(sub.order, ids) {
		t.Errorf("Submits in order %v, want the arrival order %v", sub.order, ids)
	}
}
