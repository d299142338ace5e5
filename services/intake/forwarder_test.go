package intake

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
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
	// and their marks wait for the commit after the first. Each agent's
	// messages are handed on one at a time (this Submitter takes no
	// batches): the window's Submits are the first of its first
	// submitWindow agents.
	eventually(t, "one Submit of each of the window's agents has returned", func() bool {
		return sub.totalCalls() == submitWindow
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

func (o *orderSubmitter) Submit(_ context.Context, sub busapi.Submission) (string, error) {
	msg := sub.Wire()
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

// batchSubmitter is a scheduler that takes batches (BatchSubmitter): it
// queues each batch's messages in the order given, records how many calls
// of one agent were ever in flight at once, refuses the ids in refuse for
// good, and fails every call while failing is set.
type batchSubmitter struct {
	mu          sync.Mutex
	order       []string // message ids in the order they were queued
	batches     int
	submits     int // single Submits
	inFlight    map[string]int
	maxInFlight int
	runs        map[string]string
	refuse      map[string]bool
	failing     bool
}

func newBatchSubmitter() *batchSubmitter {
	return &batchSubmitter{inFlight: map[string]int{}, runs: map[string]string{}, refuse: map[string]bool{}}
}

func (b *batchSubmitter) take(msg map[string]string) (string, error) {
	if b.refuse[msg["id"]] {
		return "", fmt.Errorf("cannot submit: %w", bus.NewError(bus.ErrInvalidArgument, "unknown agent %q", msg["agent"]))
	}
	if run, ok := b.runs[msg["id"]]; ok {
		return run, nil
	}
	run := "run-" + msg["id"]
	b.runs[msg["id"]] = run
	b.order = append(b.order, msg["id"])
	return run, nil
}

func (b *batchSubmitter) SubmitBatch(_ context.Context, subs []busapi.Submission) ([]string, []error, error) {
	msgs := wireSubmissions(subs)
	agent := msgs[0]["agent"]
	b.mu.Lock()
	b.batches++
	b.inFlight[agent]++
	b.maxInFlight = max(b.maxInFlight, b.inFlight[agent])
	b.mu.Unlock()
	runtime.Gosched() // give a second call of the agent its chance to overlap
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight[agent]--
	if b.failing {
		return nil, nil, io.ErrUnexpectedEOF
	}
	runIDs, errs := make([]string, len(msgs)), make([]error, len(msgs))
	for i, msg := range msgs {
		if msg["agent"] != agent {
			return nil, nil, fmt.Errorf("a batch mixes agents %s and %s", agent, msg["agent"])
		}
		runIDs[i], errs[i] = b.take(msg)
	}
	return runIDs, errs, nil
}

func (b *batchSubmitter) Submit(_ context.Context, sub busapi.Submission) (string, error) {
	msg := sub.Wire()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.submits++
	if b.failing {
		return "", io.ErrUnexpectedEOF
	}
	return b.take(msg)
}

// acceptInOrder stores one pending message of agent for each id, one after
// another, and returns their keys in that order.
func acceptInOrder(t *testing.T, s *Service, agent string, ids ...string) []string {
	t.Helper()
	var keys []string
	for _, id := range ids {
		if _, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: id, Channel: "ops", Author: "ada", Text: "hi", Agent: agent, ReceivedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, "hooks/"+id)
	}
	return keys
}

func numbered(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return ids
}

func TestOneAgentsBacklogGoesToTheSchedulerInFewBatchesInArrivalOrder(t *testing.T) {
	t.Parallel()
	sub := newBatchSubmitter()
	s, _ := newTestService(t, testConfig(""), WithSubmitter(sub))
	const n = 1000
	keys := acceptInOrder(t, s, "ops-agent", numbered("o", n)...)
	runService(t, s)
	eventually(t, "the backlog is submitted", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })

	sub.mu.Lock()
	defer sub.mu.Unlock()
	if want := (n + maxBatch - 1) / maxBatch; sub.batches > want || sub.submits != 0 {
		t.Errorf("%d messages took %d SubmitBatch and %d Submit calls, want at most %d batches", n, sub.batches, sub.submits, want)
	}
	if sub.maxInFlight != 1 {
		t.Errorf("%d calls of one agent were in flight at once, want 1", sub.maxInFlight)
	}
	if !slices.Equal(sub.order, keys) {
		t.Errorf("the scheduler queued the messages in another order than they arrived")
	}
	for _, id := range numbered("o", n) {
		m, _, err := s.store.message("hooks", id)
		if err != nil || m.State != stateSubmitted || m.RunID != "run-hooks/"+id || m.Attempts != 1 {
			t.Fatalf("%s is stored as %+v (%v), want submitted with its run id", id, m, err)
		}
	}
}

func TestAMessageABatchRefusesGetsAnErrorReplyAndTheAgentsOtherMessagesRun(t *testing.T) {
	t.Parallel()
	sub := newBatchSubmitter()
	sub.refuse["hooks/r-0002"] = true
	rs := newReplyServer(t, 0)
	s, _ := newTestService(t, testConfig(rs.URL), WithSubmitter(sub))
	keys := acceptInOrder(t, s, "ops-agent", numbered("r", 5)...)
	runService(t, s)
	eventually(t, "the refused message's sender gets an error reply", func() bool { _, ok := rs.counts(); return ok > 0 })
	eventually(t, "the backlog is handled", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })

	tests := []struct {
		name, id, state string
	}{
		{"Messages_before_the_refused_one_are_submitted", "r-0001", stateSubmitted},
		{"The_refused_message_ends_refused", "r-0002", stateRefused},
		{"Messages_after_the_refused_one_are_submitted", "r-0004", stateSubmitted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _, err := s.store.message("hooks", tc.id)
			if err != nil || m.State != tc.state || m.Attempts != 1 {
				t.Fatalf("%s is stored as %+v (%v), want %s after 1 attempt", tc.id, m, err, tc.state)
			}
		})
	}
	rs.mu.Lock()
	got := rs.accepted[0]
	rs.mu.Unlock()
	if got.ID != "r-0002" || got.State != "failed" || !strings.Contains(got.Error, "unknown agent") {
		t.Fatalf("error reply %+v, want a failed reply for r-0002 that says why", got)
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if want := slices.Delete(slices.Clone(keys), 2, 3); !slices.Equal(sub.order, want) {
		t.Errorf("queued %v, want %v", sub.order, want)
	}
}

func TestABatchTheSchedulerDidNotTakeIsSentAgainLaterAndKeepsItsOrder(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	sub := newBatchSubmitter()
	sub.failing = true
	s, _ := newTestService(t, testConfig(""), WithSubmitter(sub), WithClock(clock))
	keys := acceptInOrder(t, s, "ops-agent", numbered("f", 300)...)
	passes := passHook(s)
	runService(t, s)
	passes.waitFor(t, "forward/hooks")
	if attempts, lastErr := s.submitFailures("hooks", "f-0000"); attempts != 1 || lastErr == "" {
		t.Fatalf("the oldest message failed %d times (%q), want one failed call remembered", attempts, lastErr)
	}
	if in, _ := s.store.pendingCounts(); in != 300 {
		t.Fatalf("%d pending after a call that failed, want all 300", in)
	}

	sub.mu.Lock()
	sub.failing = false
	sub.mu.Unlock()
	eventually(t, "the backlog is submitted once the scheduler is back", func() bool {
		in, _ := s.store.pendingCounts()
		if in != 0 {
			clock.Advance(time.Second)
		}
		return in == 0
	})
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if !slices.Equal(sub.order, keys) {
		t.Errorf("after the retry the messages were queued in another order than they arrived")
	}
	m, _, err := s.store.message("hooks", "f-0000")
	if err != nil || m.State != stateSubmitted || m.Attempts != 2 {
		t.Fatalf("f-0000 is stored as %+v (%v), want submitted at the second attempt", m, err)
	}
}

// onlySubmit is a scheduler of before SubmitBatch on the bus: its object
// has Submit only, so SubmitBatch gets UnknownMethod.
type onlySubmit struct {
	mu    sync.Mutex
	order []string
}

func (o *onlySubmit) Submit(msg map[string]string) (string, *dbus.Error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.order = append(o.order, msg["id"])
	return "run-" + msg["id"], nil
}

func TestASchedulerWithoutSubmitBatchGetsEveryMessageBySubmitInOrder(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	sched := &onlySubmit{}
	schedConn := b.Conn(t)
	if err := schedConn.Export(sched, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := schedConn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.SchedulerName, reply, err)
	}
	keys := acceptInOrder(t, s, "ops-agent", numbered("u", 20)...)
	runService(t, s)
	eventually(t, "the backlog is submitted", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })
	sched.mu.Lock()
	defer sched.mu.Unlock()
	if !slices.Equal(sched.order, keys) {
		t.Errorf("Submits in order %v, want the arrival order %v", sched.order, keys)
	}
	m, _, err := s.store.message("hooks", "u-0019")
	if err != nil || m.State != stateSubmitted || m.RunID != "run-hooks/u-0019" {
		t.Fatalf("u-0019 is stored as %+v (%v), want submitted with its run id", m, err)
	}
}

// A batch holding a message the bus cannot carry fails before it leaves the
// process; only that message may end refused.
func TestABatchWithAMessageTheBusCannotCarryRefusesOnlyThatMessage(t *testing.T) {
	t.Parallel()
	rs := newReplyServer(t, 0)
	s, _ := newTestService(t, testConfig(rs.URL))
	b := exportOnPrivateBus(t, s)
	sched := &onlySubmit{}
	schedConn := b.Conn(t)
	if err := schedConn.Export(sched, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := schedConn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.SchedulerName, reply, err)
	}
	before := acceptInOrder(t, s, "ops-agent", "n-1")
	if _, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: "n-2", Channel: "ops", Author: "ada", Text: "hi\x00there", Agent: "ops-agent", ReceivedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	after := acceptInOrder(t, s, "ops-agent", "n-3")
	runService(t, s)
	eventually(t, "the backlog is handled", func() bool { in, _ := s.store.pendingCounts(); return in == 0 })
	m, _, err := s.store.message("hooks", "n-2")
	if err != nil || m.State != stateRefused || !strings.Contains(m.LastError, "null char") {
		t.Fatalf("n-2 = %+v (%v), want refused for its NUL", m, err)
	}
	sched.mu.Lock()
	defer sched.mu.Unlock()
	if want := append(before, after...); !slices.Equal(sched.order, want) {
		t.Errorf("the scheduler got %v, want %v", sched.order, want)
	}
}
