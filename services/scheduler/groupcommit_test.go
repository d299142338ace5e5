package scheduler

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// commitGate holds every commit of scheduler.db's committer until the test
// releases it: each commit announces itself on entered (with the number of
// writes it holds) and then commits on a nil from release, or rolls back
// and fails with the error it gets. After open, commits pass.
type commitGate struct {
	entered   chan int
	release   chan error
	opened    chan struct{}
	openOnce  sync.Once
	committed atomic.Int64 // commits that reached the disk
}

func holdCommits(t *testing.T, s *Service) *commitGate {
	g := &commitGate{entered: make(chan int, 16), release: make(chan error), opened: make(chan struct{})}
	t.Cleanup(g.open) // a failed test holds nothing
	hook := func(tx *bolt.Tx, writes int) error {
		var err error
		select {
		case g.entered <- writes:
			select {
			case err = <-g.release:
			case <-g.opened:
			}
		case <-g.opened:
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		g.committed.Add(1)
		return nil
	}
	s.store.w.SetCommitHook(hook)
	return g
}

// open lets every commit through, held or to come.
func (g *commitGate) open() { g.openOnce.Do(func() { close(g.opened) }) }

// waitEntered waits for the next commit to begin and returns the number of
// writes it holds.
func (g *commitGate) waitEntered(t *testing.T) int {
	t.Helper()
	select {
	case n := <-g.entered:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no commit started within 10s")
		return 0
	}
}

// waitQueued waits until n writes wait for the next commit.
func waitQueued(t *testing.T, s *Service, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.store.w.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes wait for the next commit, want %d", s.store.w.Waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type submitted struct {
	msgID, runID string
	err          error
}

// submitAsync submits msgID for agent in the background.
func submitAsync(s *Service, msgID, agent string, out chan<- submitted) {
	go func() {
		id, err := s.Submit(busapi.Submission{MessageID: msgID, Agent: agent, Text: "hello " + msgID})
		out <- submitted{msgID: msgID, runID: id, err: err}
	}()
}

func queuedIDs(t *testing.T, s *Service) []string {
	t.Helper()
	var ids []string
	err := s.store.db.View(func(tx *bolt.Tx) error {
		var err error
		ids, err = queuedRunIDs(tx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestASubmitIsAnsweredOnlyAfterTheCommitThatHoldsIt(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	gate := holdCommits(t, s)
	answered := make(chan int64, 1)
	var runID string
	var err error
	go func() {
		runID, err = s.Submit(busapi.Submission{MessageID: "held-1", Agent: "alpha", Text: "hi"})
		answered <- gate.committed.Load()
	}()
	gate.waitEntered(t) // the commit holding the run has begun
	select {
	case <-answered:
		t.Fatal("Submit returned while the commit holding its run had not reached the disk")
	default:
	}
	gate.release <- nil
	if at := <-answered; at != 1 {
		t.Fatalf("%d commits had reached the disk when Submit returned, want 1", at)
	}
	if err != nil {
		t.Fatalf("Submit = %v", err)
	}
	if r, err := s.GetRun(runID); err != nil || r.State != StateQueued || r.MessageID != "held-1" {
		t.Fatalf("acknowledged run = %+v, %v; want it stored, queued", r, err)
	}
}

func TestSubmitsArrivingDuringACommitShareTheNextOneInTheOrderTheyCame(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	gate := holdCommits(t, s)
	out := make(chan submitted, 21)
	commits0 := s.store.commits()
	submitAsync(s, "m00", "alpha", out)
	if n := gate.waitEntered(t); n != 1 {
		t.Fatalf("the first commit holds %d writes, want 1", n)
	}
	order := []string{"m00"}
	for i := 1; i <= 20; i++ {
		// One at a time into the committer's queue: the order it sees.
		msgID := fmt.Sprintf("m%02d", i)
		submitAsync(s, msgID, []string{"alpha", "beta"}[i%2], out)
		waitQueued(t, s, i)
		order = append(order, msgID)
	}
	gate.release <- nil
	if n := gate.waitEntered(t); n != 20 {
		t.Fatalf("the second commit holds %d writes, want the 20 that waited", n)
	}
	gate.release <- nil
	runOf := map[string]string{}
	for range 21 {
		r := <-out
		if r.err != nil {
			t.Fatalf("Submit(%s) = %v", r.msgID, r.err)
		}
		runOf[r.msgID] = r.runID
	}
	if got := s.store.commits() - commits0; got != 2 {
		t.Fatalf("21 Submits took %d commits, want 2: the held one, and one for the 20 that waited", got)
	}
	var want []string
	for _, m := range order {
		want = append(want, runOf[m])
	}
	if got := queuedIDs(t, s); !slices.Equal(got, want) {
		t.Fatalf("queue order = %v, want the order the committer took the Submits: %v", got, want)
	}
}

func TestAFailedGroupCommitFailsEverySubmitInItAndStoresNothing(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	gate := holdCommits(t, s)
	out := make(chan submitted, 11)
	submitAsync(s, "f00", "alpha", out)
	gate.waitEntered(t)
	for i := 1; i <= 10; i++ {
		submitAsync(s, fmt.Sprintf("f%02d", i), "beta", out)
	}
	waitQueued(t, s, 10)
	gate.release <- errors.New("disk is full")
	if n := gate.waitEntered(t); n != 10 {
		t.Fatalf("the second commit holds %d writes, want 10", n)
	}
	gate.release <- errors.New("disk is full")
	for range 11 {
		r := <-out
		if r.err == nil || !strings.Contains(r.err.Error(), "disk is full") || r.runID != "" {
			t.Fatalf("Submit(%s) in a failed commit = %q, %v; want the commit's error and no run", r.msgID, r.runID, r.err)
		}
	}
	gate.open()
	runs, err := s.ListRuns(RunFilter{})
	if err != nil || len(runs) != 0 {
		t.Fatalf("after failed commits ListRuns = %d runs, %v; want none", len(runs), err)
	}
	if q := queuedIDs(t, s); len(q) != 0 {
		t.Fatalf("after failed commits the queue holds %v, want nothing", q)
	}
	// The message ids were not taken: a retry makes a run.
	id, err := s.Submit(busapi.Submission{MessageID: "f03", Agent: "beta"})
	if err != nil {
		t.Fatalf("retried Submit = %v", err)
	}
	if r, err := s.GetRun(id); err != nil || r.MessageID != "f03" {
		t.Fatalf("retried Submit's run = %+v, %v", r, err)
	}
}

func TestSubmitsOfOneMessageSharingACommitGiveOneRun(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	gate := holdCommits(t, s)
	out := make(chan submitted, 11)
	submitAsync(s, "other", "alpha", out)
	gate.waitEntered(t)
	for range 10 {
		submitAsync(s, "hooks/dup", "beta", out)
	}
	waitQueued(t, s, 10)
	gate.release <- nil
	if n := gate.waitEntered(t); n != 10 {
		t.Fatalf("the second commit holds %d writes, want the 10 Submits of one message", n)
	}
	gate.release <- nil
	ids := map[string]bool{}
	for range 11 {
		r := <-out
		if r.err != nil {
			t.Fatalf("Submit(%s) = %v", r.msgID, r.err)
		}
		if r.msgID == "hooks/dup" {
			ids[r.runID] = true
		}
	}
	if len(ids) != 1 {
		t.Fatalf("10 Submits of one message in one commit gave runs %v, want one", ids)
	}
	if runs, err := s.ListRuns(RunFilter{Agent: "beta"}); err != nil || len(runs) != 1 {
		t.Fatalf("ListRuns(beta) = %d runs, %v; want 1", len(runs), err)
	}
	if q := queuedIDs(t, s); len(q) != 2 {
		t.Fatalf("queue = %v, want 2 runs", q)
	}
}

func TestARunsOutcomeAndAClaimShareACommitWithTheSubmitsOfTheMoment(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	// No Run: the test is the dispatcher, so every write is one it made.
	s := newTestService(t, testConfig(4), "", b, nil)
	first := submit(t, s, "m1", "alpha")
	if claimed, err := s.claim(); err != nil || len(claimed) != 1 {
		t.Fatalf("claim = %v, %v; want m1's run", claimed, err)
	}
	running := b.next(t)

	gate := holdCommits(t, s)
	out := make(chan submitted, 3)
	submitAsync(s, "m2", "beta", out)
	gate.waitEntered(t)
	running.reply("done") // its outcome waits for the next commit
	waitQueued(t, s, 1)
	claimed := make(chan []Run, 1)
	go func() {
		runs, err := s.claim()
		if err != nil {
			t.Errorf("claim = %v", err)
		}
		claimed <- runs
	}()
	waitQueued(t, s, 2)
	submitAsync(s, "m3", "gamma", out)
	waitQueued(t, s, 3)
	submitAsync(s, "m4", "alpha", out)
	waitQueued(t, s, 4)
	// Group commits only: the run the claim starts takes beta's first uid
	// in a transaction of its own (store.update) whenever its goroutine
	// gets there, which is none of the writes this test counts.
	commits0 := s.store.groupCommits()
	gate.release <- nil
	if n := gate.waitEntered(t); n != 4 {
		t.Fatalf("the commit after the held one holds %d writes, want 4: the outcome, the claim and two Submits", n)
	}
	gate.release <- nil
	for range 3 {
		if r := <-out; r.err != nil {
			t.Fatalf("Submit(%s) = %v", r.msgID, r.err)
		}
	}
	runs := <-claimed
	if got := s.store.groupCommits() - commits0; got != 2 {
		t.Fatalf("the held Submit and the four writes behind it took %d commits, want 2", got)
	}
	if r := waitState(t, s, first, StateSucceeded); r.Reply != "done" {
		t.Fatalf("run %s reply = %q, want done", first, r.Reply)
	}
	// The claim came before m3 and m4 in the commit: it started beta's m2.
	if len(runs) != 1 || runs[0].MessageID != "m2" {
		t.Fatalf("the shared claim started %v, want m2's run", runs)
	}
	gate.open()
	b.next(t).reply("done")
	waitState(t, s, runs[0].ID, StateSucceeded)
}

func TestTheDispatcherSkipsQueuedRunsCanceledAfterItSawThem(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	start(t, s)
	first := submit(t, s, "m1", "alpha")
	running := b.next(t)
	canceled := submit(t, s, "m2", "alpha")
	next := submit(t, s, "m3", "alpha")
	waitPass(t, s) // the dispatcher has seen m2 and m3 wait behind m1
	if err := s.CancelRun(canceled); err != nil {
		t.Fatalf("CancelRun = %v", err)
	}
	// Another agent's run starts at once, whatever alpha's line holds.
	other := submit(t, s, "m4", "beta")
	if got := b.next(t).spec.RunID; got != other {
		t.Fatalf("started %s, want beta's run %s", got, other)
	}
	running.reply("done")
	waitState(t, s, first, StateSucceeded)
	if got := b.next(t).spec.RunID; got != next {
		t.Fatalf("after the canceled run alpha started %s, want %s", got, next)
	}
	runs, err := s.ListRuns(RunFilter{State: StateCanceled})
	if err != nil || len(runs) != 1 || runs[0].ID != canceled {
		t.Fatalf("ListRuns(canceled) = %v, %v; want the canceled run listed", runs, err)
	}
}

func TestAnAllowedSubmitterIsAskedForAgainOnlyAfterAMinute(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	tb := testbus.Start(t, testbus.Options{})
	clock := clockwork.NewFakeClock()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil, withClock(clock))
	obj := &schedulerObject{s: s, conn: tb.Conn(t)}
	intake := tb.Conn(t)
	sender := dbus.Sender(intake.Names()[0])
	if _, derr := obj.Submit(sender, map[string]string{"id": "a1", "agent": "alpha"}); derr != nil {
		t.Fatalf("Submit from root = %v", derr)
	}
	// Gone from the bus: only the remembered answer lets it through now.
	intake.Close()
	waitNameGone(t, obj.conn, string(sender))
	clock.Advance(allowedFor / 2)
	if _, derr := obj.Submit(sender, map[string]string{"id": "a2", "agent": "alpha"}); derr != nil {
		t.Fatalf("Submit within the minute = %v, want the remembered answer", derr)
	}
	clock.Advance(allowedFor)
	if _, derr := obj.Submit(sender, map[string]string{"id": "a3", "agent": "alpha"}); derr == nil || derr.Name != bus.ErrAccessDenied {
		t.Fatalf("Submit after the minute = %v, want the bus asked again (AccessDenied: the sender is gone)", derr)
	}
	if _, derr := obj.Submit(dbus.Sender(":1.999999"), map[string]string{"id": "a4", "agent": "alpha"}); derr == nil {
		t.Fatal("Submit from a sender the bus does not know was allowed")
	}
}

// waitNameGone waits until the bus no longer knows name.
func waitNameGone(t *testing.T, conn *dbus.Conn, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var has bool
		if err := conn.BusObject().Call("org.freedesktop.DBus.NameHasOwner", 0, name).Store(&has); err != nil {
			t.Fatal(err)
		}
		if !has {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still on the bus after 10s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAWriteThatFailsInAGroupLeavesTheOthersAppliedOnce(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	gate := holdCommits(t, s)
	out := make(chan submitted, 4)
	submitAsync(s, "first", "alpha", out)
	gate.waitEntered(t)
	submitAsync(s, "g1", "alpha", out)
	waitQueued(t, s, 1)
	failed := make(chan error, 1)
	go func() {
		failed <- s.store.write(func(tx *bolt.Tx) error {
			if err := runsBucket(tx).Put([]byte("stray"), []byte("{}")); err != nil {
				return err
			}
			return errors.New("this write is refused")
		})
	}()
	waitQueued(t, s, 2)
	submitAsync(s, "g1", "alpha", out) // the same message, after the failing write
	waitQueued(t, s, 3)
	submitAsync(s, "g2", "beta", out)
	waitQueued(t, s, 4)
	gate.release <- nil
	if n := gate.waitEntered(t); n != 3 {
		t.Fatalf("the group's commit holds %d writes, want the 3 left once the failing one is out", n)
	}
	gate.release <- nil
	if err := <-failed; err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("the failing write = %v, want its own error", err)
	}
	runOf := map[string][]string{}
	for range 4 {
		r := <-out
		if r.err != nil {
			t.Fatalf("Submit(%s) = %v", r.msgID, r.err)
		}
		runOf[r.msgID] = append(runOf[r.msgID], r.runID)
	}
	if ids := runOf["g1"]; len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("the two Submits of g1 got runs %v, want one run", ids)
	}
	if _, err := s.GetRun("stray"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the failed write's record is stored (GetRun = %v)", err)
	}
	if q := queuedIDs(t, s); len(q) != 3 {
		t.Fatalf("queue = %v, want first, g1 and g2 once each", q)
	}
}
