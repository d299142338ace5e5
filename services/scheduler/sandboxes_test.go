package scheduler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// sandboxConfig has agent alpha keep a sandbox per conversation on the
// landlock backend, running the real berth-agent with the local provider
// ("/sh COMMAND" runs COMMAND), with an egress proxy (an allow rule) so its
// tools' requests are decisions.
func sandboxConfig(t *testing.T, idle time.Duration, perAgent int) *config.Config {
	t.Helper()
	_, proxyBin := egressBinaries(t)
	cfg := testConfig(8)
	cfg.Scheduler.AgentBinary = berthAgent(t)
	cfg.Scheduler.EgressBinary = proxyBin
	cfg.Scheduler.EgressUser = "daemon"
	idleStop := config.Duration(idle)
	cfg.Agents[0].Egress.Allow = []string{"example.org:443"}
	cfg.Agents[0].Sandbox = config.SandboxSettings{Scope: config.SandboxScopeConversation, IdleStop: &idleStop, MaxPerAgent: &perAgent}
	return cfg
}

// sandboxService runs a service on cfg with the real landlock backend and
// clock, in stateDir.
func sandboxService(t *testing.T, cfg *config.Config, stateDir string, clock clockwork.Clock) *Service {
	t.Helper()
	testenv.NeedRoot(t)
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
		Clock:    clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 1)
	passes.Store(s, ch)
	s.passed = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { passes.Delete(s) })
	return s
}

// sandboxStateDir is a state directory outside /tmp: the state directory
// is protected from agents, and one under /tmp would make a host
// sandbox's own /tmp unwritable as its policy is made from the host's view
// (as /var/lib/berth is in production).
func sandboxStateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/lib", "berth-sbx-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

var sandboxMessages atomic.Int64

// say submits text to alpha in thread of channel C1 and returns the run id.
func say(t *testing.T, s *Service, thread, text string) string {
	t.Helper()
	return submit(t, s, fmt.Sprintf("m%d", sandboxMessages.Add(1)), "alpha", "text", text, "connector", "", "channel", "C1", "thread", thread)
}

// finished waits for run id to finish.
func finished(t *testing.T, s *Service, id string) Run {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r, err := s.GetRun(id)
		if err == nil && Finished(r.State) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %q after 90s (err %v)", id, r.State, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// succeeded waits for run id and fails the test unless it succeeded.
func succeeded(t *testing.T, s *Service, id string) Run {
	t.Helper()
	r := finished(t, s, id)
	if r.State != StateSucceeded {
		t.Fatalf("run %s: %s %q: %s\nstderr: %s", id, r.State, r.Reason, r.Error, r.StderrTail)
	}
	return r
}

// thread1 is the only sandbox of the listing, in thread t.
func onlySandbox(t *testing.T, s *Service) SandboxInfo {
	t.Helper()
	list := s.ListSandboxes(context.Background(), "")
	if len(list) != 1 {
		t.Fatalf("sandboxes = %+v, want one", list)
	}
	return list[0]
}

// recordedSandboxes are the ids sandboxes/ holds.
func recordedSandboxes(t *testing.T, s *Service) []string {
	t.Helper()
	var ids []string
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error { ids = append(ids, string(k)); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A tool that keeps calling out keeps its sandbox, however long ago the
// last message was: idle_stop counts from the last egress request. Once
// the calls stop, the reaper stops the sandbox idle_stop later.
func TestIdleStopCountsFromTheLastEgressRequestNotTheLastMessage(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	s := sandboxService(t, sandboxConfig(t, 4*time.Second, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	// The first message leaves a tool calling out (refused: activity all
	// the same) until it finds the file "stop" in the workspace.
	first := succeeded(t, s, say(t, s, "T1", `/sh (while [ ! -e stop ]; do curl -s -o /dev/null --noproxy '' -x "$HTTP_PROXY" http://refused.example/; sleep 0.05; done; touch stopped) >/dev/null 2>&1 & pwd`))
	workspace := shellOut(first.Reply)
	if first.Sandbox == "" {
		t.Fatalf("the run of a conversation agent names no sandbox: %+v", first)
	}
	sb := onlySandbox(t, s)
	if sb.ID != first.Sandbox || sb.Thread != "T1" || sb.Runs != 1 || sb.Backend != landlock.Name {
		t.Fatalf("listing = %+v, want the first run's sandbox %s after 1 run", sb, first.Sandbox)
	}

	// Three times 3s: 9s past the message, more than twice idle_stop, and
	// each time an egress request came after the clock moved on.
	for range 3 {
		clock.Advance(3 * time.Second)
		waitActivity(t, s, clock.Now())
		s.reapSandboxes()
		if got := onlySandbox(t, s); got.ID != sb.ID {
			t.Fatalf("the sandbox was replaced: %+v", got)
		}
	}

	// The tool stops calling out; 4s later the sandbox is stopped.
	if err := os.WriteFile(filepath.Join(workspace, "stop"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(workspace, "stopped"))
	last := clock.Now()
	clock.Advance(3 * time.Second)
	s.reapSandboxes()
	if len(s.ListSandboxes(context.Background(), "")) != 1 {
		t.Fatal("the sandbox was stopped 3s after its last activity; idle_stop is 4s")
	}
	clock.Advance(time.Second)
	s.reapSandboxes()
	if list := s.ListSandboxes(context.Background(), ""); len(list) != 0 {
		t.Fatalf("sandboxes %+v are alive %s after their last activity (idle_stop 4s)", list, clock.Since(last))
	}
	if ids := recordedSandboxes(t, s); len(ids) != 0 {
		t.Errorf("sandboxes/ still holds %v after the stop", ids)
	}
	// The next message of the conversation gets a fresh sandbox.
	next := succeeded(t, s, say(t, s, "T1", "/sh echo again"))
	if next.Sandbox == "" || next.Sandbox == first.Sandbox {
		t.Errorf("the message after an idle stop ran in sandbox %q, want a fresh one (not %s)", next.Sandbox, first.Sandbox)
	}
}

// waitActivity waits until the only sandbox's last activity is at least at.
func waitActivity(t *testing.T, s *Service, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if list := s.ListSandboxes(context.Background(), ""); len(list) == 1 && !list[0].LastActivity.Before(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no activity of the sandbox since %s: %+v", at, s.ListSandboxes(context.Background(), ""))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within 60s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A conversation's second message runs in the sandbox its first one left
// (its /tmp kept); another conversation of the agent runs in its own and
// cannot see the first one's /tmp.
func TestAConversationKeepsItsSandboxAndAnotherCannotSeeItsTmp(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Minute, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	a1 := succeeded(t, s, say(t, s, "A", "/sh echo from-a > /tmp/mine; echo ok"))
	a2 := succeeded(t, s, say(t, s, "A", "/sh cat /tmp/mine"))
	b1 := succeeded(t, s, say(t, s, "B", "/sh cat /tmp/mine 2>&1; echo done"))
	if a2.Sandbox != a1.Sandbox || !strings.Contains(a2.Reply, "from-a") {
		t.Errorf("the conversation's second message ran in %s (first in %s) and read %q; want its own /tmp", a2.Sandbox, a1.Sandbox, a2.Reply)
	}
	if b1.Sandbox == a1.Sandbox || strings.Contains(b1.Reply, "from-a") {
		t.Errorf("another conversation ran in %s (A's is %s) and read %q from /tmp; want a sandbox of its own", b1.Sandbox, a1.Sandbox, b1.Reply)
	}
	if n := len(s.ListSandboxes(context.Background(), "alpha")); n != 2 {
		t.Errorf("alpha has %d sandboxes, want 2", n)
	}
}

// At max_lifetime a sandbox is stopped after its current run; the next
// message gets a fresh one, and the run record says why.
func TestASandboxAtItsMaxLifetimeIsReplacedAfterItsRun(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	cfg := sandboxConfig(t, time.Hour, 3)
	lifetime := config.Duration(2 * time.Hour)
	cfg.Agents[0].Sandbox.MaxLifetime = &lifetime
	s := sandboxService(t, cfg, sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	first := succeeded(t, s, say(t, s, "A", "/sh echo state > /tmp/state; pwd"))
	workspace := shellOut(first.Reply)
	clock.Advance(59 * time.Minute)
	succeeded(t, s, say(t, s, "A", "/sh echo still"))
	// A run under way when the sandbox reaches its lifetime ends in it.
	id := say(t, s, "A", "/sh while [ ! -e go ]; do sleep 0.05; done; cat /tmp/state")
	waitRunning(t, s, id)
	clock.Advance(62 * time.Minute)
	s.reapSandboxes()
	if err := os.WriteFile(filepath.Join(workspace, "go"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	last := succeeded(t, s, id)
	if last.Sandbox != first.Sandbox || !strings.Contains(last.Reply, "state") {
		t.Fatalf("the run under way at max_lifetime ran in %s (want %s) and read %q", last.Sandbox, first.Sandbox, last.Reply)
	}
	if !strings.Contains(last.SandboxNote, "reached max_lifetime (2h0m0s)") {
		t.Errorf("the last run's record does not say the sandbox reached its lifetime: %q", last.SandboxNote)
	}
	if list := s.ListSandboxes(context.Background(), ""); len(list) != 0 {
		t.Errorf("the sandbox past its lifetime is still listed: %+v", list)
	}
	fresh := succeeded(t, s, say(t, s, "A", "/sh cat /tmp/state 2>&1; echo done"))
	if fresh.Sandbox == first.Sandbox || strings.Contains(fresh.Reply, "state\n") {
		t.Errorf("the next message ran in %s and read %q; want a fresh sandbox without the old /tmp", fresh.Sandbox, fresh.Reply)
	}
}

// At max_per_agent a new conversation first stops the sandbox idle the
// longest; when every sandbox is busy it waits in the queue, FIFO, with the
// reason in its record.
func TestAtMaxPerAgentTheLongestIdleIsStoppedOrTheNewConversationWaits(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 2), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	a := succeeded(t, s, say(t, s, "A", "/sh echo a"))
	clock.Advance(time.Minute)
	b := succeeded(t, s, say(t, s, "B", "/sh echo b"))
	clock.Advance(time.Minute)
	c := succeeded(t, s, say(t, s, "C", "/sh echo c"))
	if !strings.Contains(c.SandboxNote, a.Sandbox) || !strings.Contains(c.SandboxNote, "max_per_agent 2") {
		t.Errorf("C's record does not say A's sandbox %s was stopped for it: %q", a.Sandbox, c.SandboxNote)
	}
	ids := map[string]bool{}
	for _, sb := range s.ListSandboxes(context.Background(), "alpha") {
		ids[sb.ID] = true
	}
	if len(ids) != 2 || !ids[b.Sandbox] || !ids[c.Sandbox] {
		t.Fatalf("sandboxes %v; want B's %s and C's %s (A's, idle the longest, stopped)", ids, b.Sandbox, c.Sandbox)
	}

	// B and C busy (each waits for a file): D waits, then takes the first
	// sandbox freed.
	workspace := shellOut(succeeded(t, s, say(t, s, "B", "/sh pwd")).Reply)
	busyB := say(t, s, "B", "/sh while [ ! -e go-b ]; do sleep 0.05; done; echo b")
	busyC := say(t, s, "C", "/sh while [ ! -e go-c ]; do sleep 0.05; done; echo c")
	waitRunning(t, s, busyB)
	waitRunning(t, s, busyC)
	d := say(t, s, "D", "/sh echo d")
	waitPass(t, s)
	r, err := s.GetRun(d)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateQueued || !strings.Contains(r.SandboxNote, "all 2 sandboxes of agent alpha were busy") {
		t.Fatalf("D with every sandbox busy: %s, note %q; want queued with the reason", r.State, r.SandboxNote)
	}
	if err := os.WriteFile(filepath.Join(workspace, "go-c"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	succeeded(t, s, busyC)
	dr := succeeded(t, s, d)
	if !strings.Contains(dr.SandboxNote, "waited in the queue") {
		t.Errorf("D's record does not say it waited: %q", dr.SandboxNote)
	}
	if err := os.WriteFile(filepath.Join(workspace, "go-b"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	succeeded(t, s, busyB)
}

func waitRunning(t *testing.T, s *Service, id string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if r, err := s.GetRun(id); err == nil && r.State == StateRunning && s.sandboxes.claimOf(id) != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s did not start within 90s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two conversations of one agent run at the same time, each in its own
// sandbox, and their notes in the agent's shared MEMORY.md are all kept.
func TestTwoConversationsOfOneAgentRunInParallelAndKeepTheSharedMemoryIntact(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	workspace := shellOut(succeeded(t, s, say(t, s, "A", "/sh pwd")).Reply)
	succeeded(t, s, say(t, s, "B", "/sh pwd"))
	// A waits until B runs too: only parallel runs finish.
	a := say(t, s, "A", "/sh touch a-runs; while [ ! -e b-runs ]; do sleep 0.05; done; echo a")
	b := say(t, s, "B", "/sh touch b-runs; while [ ! -e a-runs ]; do sleep 0.05; done; echo b")
	succeeded(t, s, a)
	succeeded(t, s, b)

	const notes = 8
	var ids []string
	for i := range notes {
		for _, thread := range []string{"A", "B"} {
			ids = append(ids, say(t, s, thread, fmt.Sprintf(`/tool memory_note {"content":"note %s%d"}`, thread, i)))
		}
	}
	for _, id := range ids {
		succeeded(t, s, id)
	}
	data, err := os.ReadFile(filepath.Join(workspace, "MEMORY.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range notes {
		for _, thread := range []string{"A", "B"} {
			if want := fmt.Sprintf("note %s%d", thread, i); !strings.Contains(string(data), want) {
				t.Errorf("MEMORY.md lacks %q:\n%s", want, data)
			}
		}
	}
}

// A scheduler that died (dropped without Close or a stop) with three live
// sandboxes leaves records; the next one on the same state directory
// removes each of them (Backend.Kill by handle): none leaks.
func TestARestartedSchedulerRemovesEverySandboxTheDeadOneLeft(t *testing.T) {
	t.Parallel()
	state := sandboxStateDir(t)
	cfg := sandboxConfig(t, time.Hour, 3)
	clock := clockwork.NewFakeClock()
	old := sandboxService(t, cfg, state, clock)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- old.Run(ctx) }()
	var pids []string
	for _, thread := range []string{"A", "B", "C"} {
		r := succeeded(t, old, say(t, old, thread, "/sh sleep 600 >/dev/null 2>&1 & echo $!"))
		pids = append(pids, shellOut(r.Reply))
	}
	if n := len(recordedSandboxes(t, old)); n != 3 {
		t.Fatalf("sandboxes/ holds %d, want the 3 live ones", n)
	}
	var handles []string
	for _, sb := range old.ListSandboxes(context.Background(), "") {
		handles = append(handles, sb.ID)
	}
	// The process "dies": its sandboxes are not stopped, its store is let
	// go as a crash lets it go. (Their egress proxies, which a crash ends,
	// are stopped once the test is over.)
	old.abandonSandboxes.Store(true)
	cancel()
	<-done
	if err := old.store.close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, sb := range old.sandboxes.byConv {
			sb.prep.Finish()
		}
	})
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + pid); err != nil {
			t.Fatalf("background process %s of a sandbox ended with its scheduler's stop; the test needs it alive", pid)
		}
	}

	s := sandboxService(t, cfg, state, clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)
	succeeded(t, s, say(t, s, "D", "/sh echo after")) // Run has passed its start
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("background process %s of a dead scheduler's sandbox is still running", pid)
		}
	}
	left := recordedSandboxes(t, s)
	for _, id := range handles {
		for _, l := range left {
			if l == id {
				t.Errorf("sandbox %s is still recorded after the restart", id)
			}
		}
	}
}

// processGone tells whether pid no longer runs (a zombie only waits to be
// reaped).
func processGone(pid string) bool {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] == 'Z'
}

// shellOut is the stdout of a "/sh" reply of the local provider.
func shellOut(reply string) string {
	_, out, _ := strings.Cut(reply, "\n")
	out, _, _ = strings.Cut(out, "\n[stderr]\n")
	return strings.TrimSpace(out)
}

// A backend that cannot keep a sandbox here (one without Keeper, a host
// backend under systemd) still answers a conversation agent's message, in
// a fresh sandbox of its own, and the run record says why.
func TestAConversationMessageOnABackendThatCannotKeepRunsInAFreshSandbox(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	cfg.Agents[0].Sandbox = config.SandboxSettings{Scope: config.SandboxScopeConversation}
	b := newGateBackend("landlock")
	s := newTestService(t, cfg, "", b, nil)
	start(t, s)
	id := submit(t, s, "m1", "alpha", "thread", "T")
	b.next(t).reply("answered")
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded || r.Reply != "answered" || r.Sandbox != "" || !strings.Contains(r.SandboxNote, "ran in a fresh sandbox of its own") {
		t.Fatalf("run = %s %q, sandbox %q, note %q; want it answered in a fresh sandbox, saying why", r.State, r.Reply, r.Sandbox, r.SandboxNote)
	}
	if list := s.ListSandboxes(context.Background(), ""); len(list) != 0 {
		t.Errorf("sandboxes listed: %+v", list)
	}
}
