package scheduler

import (
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

func TestSubmitValidatesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		msg     busapi.Submission
		wantErr string
	}{
		{"Message_without_id_is_refused", busapi.Submission{Agent: "alpha"}, "no id"},
		{"Message_without_agent_is_refused", busapi.Submission{MessageID: "m1"}, "no agent"},
		{"Unknown_agent_is_refused_naming_the_known_ones", busapi.Submission{MessageID: "m1", Agent: "zeta"}, "alpha, beta, gamma"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
			_, err := s.Submit(tc.msg)
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Submit error = %v, want InvalidArgument mentioning %q", err, tc.wantErr)
			}
		})
	}

	t.Run("Same_message_id_returns_the_same_run_and_queues_nothing_new", func(t *testing.T) {
		t.Parallel()
		s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
		first := submit(t, s, "m1", "alpha")
		again := submit(t, s, "m1", "alpha")
		if again != first {
			t.Fatalf("second Submit returned %s, want %s", again, first)
		}
		runs, err := s.ListRuns(RunFilter{})
		if err != nil || len(runs) != 1 {
			t.Fatalf("ListRuns = %d runs (err %v), want 1", len(runs), err)
		}
		if !bus.RunPath(first).IsValid() {
			t.Fatalf("run id %q is not a valid object path element", first)
		}
	})
}

func TestSubmittedRunSurvivesCloseAndReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newTestService(t, testConfig(4), dir, newGateBackend("landlock"), nil)
	id := submit(t, s, "m1", "alpha", "connector", "hook", "channel", "c1", "author", "ann")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = newTestService(t, testConfig(4), dir, newGateBackend("landlock"), nil)
	r, err := s.GetRun(id)
	if err != nil {
		t.Fatalf("GetRun after reopen: %v", err)
	}
	if r.State != StateQueued || r.MessageID != "m1" || r.Connector != "hook" || r.Author != "ann" {
		t.Fatalf("run after reopen = %+v", r)
	}
	if again := submit(t, s, "m1", "alpha"); again != id {
		t.Fatalf("Submit after reopen returned %s, want %s", again, id)
	}
}

func TestOneAgentRunsInOrderWhileAgentsRunInParallel(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	a1 := submit(t, s, "a1", "alpha")
	a2 := submit(t, s, "a2", "alpha")
	a3 := submit(t, s, "a3", "alpha")
	b1 := submit(t, s, "b1", "beta")
	start(t, s)

	first, second := b.next(t), b.next(t)
	got := map[string]*gatedRun{first.spec.RunID: first, second.spec.RunID: second}
	if got[a1] == nil || got[b1] == nil {
		t.Fatalf("started %s and %s, want %s (alpha) and %s (beta) together", first.spec.RunID, second.spec.RunID, a1, b1)
	}
	b.none(t, s)

	got[b1].reply("b1 done")
	got[a1].reply("a1 done")
	waitState(t, s, b1, StateSucceeded)
	for _, want := range []string{a2, a3} {
		r := b.next(t)
		if r.spec.RunID != want {
			t.Fatalf("started %s, want %s (FIFO per agent)", r.spec.RunID, want)
		}
		b.none(t, s)
		r.reply("done")
		waitState(t, s, want, StateSucceeded)
	}
	if overlaps, maxTotal, _ := b.stats(); overlaps != 0 || maxTotal != 2 {
		t.Fatalf("agent overlaps = %d, max parallel = %d; want 0 and 2", overlaps, maxTotal)
	}
	if r := waitState(t, s, a1, StateSucceeded); r.Reply != "a1 done" || r.Attempts != 1 || r.Backend != "landlock" {
		t.Fatalf("run a1 = %+v", r)
	}
}

func TestMaxConcurrentRunsLimitsAllAgents(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(2), "", b, nil)
	submit(t, s, "a1", "alpha")
	submit(t, s, "b1", "beta")
	c1 := submit(t, s, "c1", "gamma")
	start(t, s)

	first, second := b.next(t), b.next(t)
	b.none(t, s)
	first.reply("done")
	if third := b.next(t); third.spec.RunID != c1 {
		t.Fatalf("third run is %s, want %s", third.spec.RunID, c1)
	} else {
		third.reply("done")
	}
	second.reply("done")
	waitState(t, s, c1, StateSucceeded)
	if _, maxTotal, _ := b.stats(); maxTotal != 2 {
		t.Fatalf("max parallel runs = %d, want 2", maxTotal)
	}
}

func TestRunOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		outcome    outcome
		wantState  string
		wantReason string
		wantReply  string
	}{
		{"Response_without_error_succeeds",
			outcome{res: isolation.Result{Response: agentproto.Response{Reply: "hi", ToolCalls: []agentproto.ToolCall{{Name: "shell", Output: "ok"}}}, Stderr: "log line"}},
			StateSucceeded, "", "hi"},
		{"Response_error_fails_the_run_with_it",
			outcome{res: isolation.Result{Response: agentproto.Response{Error: "max iterations reached"}, ExitCode: 1}},
			StateFailed, "max iterations reached", ""},
		{"Backend_timeout_fails_the_run_with_reason_timeout",
			outcome{err: isolation.Errorf(isolation.ReasonTimeout, "killed after 1s")},
			StateFailed, isolation.ReasonTimeout, ""},
		{"Crashed_agent_fails_the_run",
			outcome{res: isolation.Result{Stderr: "panic: boom"}, err: isolation.Errorf(isolation.ReasonCrashed, "exit status 2")},
			StateFailed, isolation.ReasonCrashed, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newGateBackend("landlock")
			d := newDeliveries(0)
			s := newTestService(t, testConfig(4), "", b, d)
			id := submit(t, s, "m1", "alpha", "connector", "hook", "channel", "c1", "thread", "t1")
			start(t, s)
			b.next(t).finish <- tc.outcome
			r := waitState(t, s, id, tc.wantState)
			if r.Reason != tc.wantReason || r.Reply != tc.wantReply || r.FinishedAt.IsZero() {
				t.Fatalf("run = %+v, want reason %q reply %q", r, tc.wantReason, tc.wantReply)
			}
			if r.StderrTail != tc.outcome.res.Stderr {
				t.Fatalf("stderr tail = %q, want %q", r.StderrTail, tc.outcome.res.Stderr)
			}
			if len(tc.outcome.res.Response.ToolCalls) > 0 && !strings.Contains(string(r.ToolCalls), `"shell"`) {
				t.Fatalf("tool calls = %s", r.ToolCalls)
			}
			reply := waitDeliveredTo(t, s, d, id)
			if reply.State != tc.wantState || reply.Connector != "hook" || reply.Channel != "c1" || reply.Thread != "t1" {
				t.Fatalf("delivered %+v", reply)
			}
			if tc.wantState == StateFailed && !strings.Contains(reply.Text, tc.wantReason) {
				t.Fatalf("failure text %q does not give the reason %q", reply.Text, tc.wantReason)
			}
		})
	}
}

func TestTimeoutComesFromTheAgentAndEndsTheRun(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	cfg := testConfig(4)
	timeout := 1
	cfg.Agents[0].ContainerMode.TimeoutSeconds = &timeout
	s := newTestService(t, cfg, "", b, nil)
	id := submit(t, s, "m1", "alpha")
	start(t, s)
	if run := b.next(t); run.spec.Timeout != time.Second {
		t.Fatalf("Spec.Timeout = %s, want 1s", run.spec.Timeout)
	}
	if r := waitState(t, s, id, StateFailed); r.Reason != isolation.ReasonTimeout {
		t.Fatalf("reason = %q, want %q", r.Reason, isolation.ReasonTimeout)
	}
}

func TestContainerAgentFailsWithoutContainerBackend(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	enabled := true
	cfg.Agents[0].ContainerMode.Enabled = &enabled
	b := newGateBackend("landlock")
	s := newTestService(t, cfg, "", b, nil)
	id := submit(t, s, "m1", "alpha")
	start(t, s)
	if r := waitState(t, s, id, StateFailed); r.Reason != isolation.ReasonContainerUnavailable {
		t.Fatalf("reason = %q, want %q", r.Reason, isolation.ReasonContainerUnavailable)
	}
	b.none(t, s)
}

func TestRequestAndWorkspaceOfARun(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: it checks the workspace is handed to the run user")
	}
	stateDir := t.TempDir()
	cfgDir := t.TempDir()
	otherWS := filepath.Join(t.TempDir(), "beta-ws")
	cfg := testConfig(4)
	// About run_as: every agent as the one configured user.
	cfg.Scheduler.AgentUIDs = config.UIDRange{Off: true}
	cfg.Sources = []string{filepath.Join(cfgDir, "berth.toml")}
	cfg.Agents[1].Workspace = otherWS
	network := true // a remote provider needs it (checkProviderNetwork)
	cfg.Agents[0].FileAccess.AllowNetwork = &network
	cfg.Providers = config.Providers{Primary: "main", Fallback: []string{"backup"}, Entries: map[string]config.Provider{
		"main":   {Name: "main", Kind: "openai", APIKeyEnv: "MAIN_KEY", Model: "m"},
		"backup": {Name: "backup", Kind: "local"},
	}}
	b := newGateBackend("landlock")
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{"landlock": b},
		Getenv: func(k string) string {
			if k == "MAIN_KEY" {
				return "sekrit"
			}
			return ""
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	id := submit(t, s, "m1", "alpha", "connector", "hook", "channel", "c1", "channel_name", "general", "author", "ann")
	start(t, s)
	run := b.next(t)
	defer run.reply("ok")

	ws := filepath.Join(stateDir, "agents", "alpha")
	req := run.spec.Request
	if run.spec.Workspace != ws || req.Workspace != ws || req.RunID != id || req.Version != agentproto.Version {
		t.Fatalf("spec workspace %q, request %+v", run.spec.Workspace, req)
	}
	if req.Message.Text != "hello m1" || req.Message.ChannelName != "general" || req.Message.Author != "ann" || req.Agent.MaxIterations != 10 {
		t.Fatalf("request message/agent = %+v / %+v", req.Message, req.Agent)
	}
	if req.Provider.Name != "main" || req.Provider.Key != "sekrit" || len(req.Fallback) != 1 || req.Fallback[0].Name != "backup" {
		t.Fatalf("providers = %+v then %+v", req.Provider, req.Fallback)
	}
	if run.spec.RunAs != "nobody" || run.spec.AgentBinary != "/nonexistent/berth-agent" {
		t.Fatalf("spec run as %q binary %q", run.spec.RunAs, run.spec.AgentBinary)
	}
	if !slices.Contains(req.Policy.AllowReadWrite, ws) {
		t.Fatalf("policy does not allow the workspace: %+v", req.Policy)
	}
	for _, denied := range []string{filepath.Join(stateDir, DBName), cfgDir, otherWS} {
		if !slices.Contains(req.Policy.Deny, denied) {
			t.Fatalf("policy does not deny %s: %v", denied, req.Policy.Deny)
		}
	}
	nobody, _ := user.Lookup("nobody")
	info, err := os.Stat(ws)
	if err != nil {
		t.Fatal(err)
	}
	st := info.Sys().(*syscall.Stat_t)
	if info.Mode().Perm() != 0o700 || strconv.Itoa(int(st.Uid)) != nobody.Uid {
		t.Fatalf("workspace mode %v owner %d, want 0700 owned by nobody", info.Mode().Perm(), st.Uid)
	}
	if info, _ := os.Stat(filepath.Dir(ws)); info.Mode().Perm() != 0o755 {
		t.Fatalf("agents dir mode %v, want 0755", info.Mode().Perm())
	}
	if r := waitState(t, s, id, StateRunning); r.Handle != "gate:"+id {
		t.Fatalf("handle = %q, want the one OnStart reported", r.Handle)
	}
}

func TestCancelRun(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	running := submit(t, s, "a1", "alpha")
	queued := submit(t, s, "a2", "alpha")
	start(t, s)
	b.next(t)
	waitState(t, s, running, StateRunning)

	tests := []struct {
		name    string
		id      string
		wantErr error
	}{
		{"Queued_run_is_canceled_without_starting", queued, nil},
		{"Running_run_is_killed_and_canceled", running, nil},
		{"Finished_run_cannot_be_canceled", running, ErrInvalidArgument},
		{"Unknown_run_is_not_found", "nope", ErrNotFound},
	}
	for _, tc := range tests { // in order: each step builds on the one before
		t.Run(tc.name, func(t *testing.T) {
			err := s.CancelRun(tc.id)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("CancelRun = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil {
				if r := waitState(t, s, tc.id, StateCanceled); r.Reason != isolation.ReasonCanceled {
					t.Fatalf("reason = %q", r.Reason)
				}
			}
		})
	}
	b.none(t, s)
}

func TestGracefulStopRequeuesRunningRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), dir, b, nil)
	id := submit(t, s, "a1", "alpha")
	stop := start(t, s)
	b.next(t)
	waitState(t, s, id, StateRunning)
	stop()
	if r := waitState(t, s, id, StateQueued); r.Attempts != 0 {
		t.Fatalf("attempts after graceful stop = %d, want 0", r.Attempts)
	}
	start(t, s)
	b.next(t).reply("done")
	waitState(t, s, id, StateSucceeded)
}

func TestReloadKeepsQueuedRuns(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	id := submit(t, s, "a1", "alpha")
	cfg := testConfig(4)
	cfg.Agents = append(cfg.Agents, config.AgentSettings{ID: "delta"})
	s.Reload(cfg)
	delta := submit(t, s, "d1", "delta")
	start(t, s)
	for range 2 {
		b.next(t).reply("ok")
	}
	waitState(t, s, id, StateSucceeded)
	waitState(t, s, delta, StateSucceeded)
}

// writeRuns puts runs straight into a store, as a crashed scheduler left them.
func writeRuns(t *testing.T, dir string, runs ...Run) {
	t.Helper()
	st, err := openStore(filepath.Join(dir, DBName))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	err = st.db.Update(func(tx *boltTx) error {
		for _, r := range runs {
			if err := putRun(tx, r); err != nil {
				return err
			}
			if err := messagesBucket(tx).Put([]byte(r.MessageID), []byte(r.ID)); err != nil {
				return err
			}
			// As NextSequence would have numbered it.
			if q := queueBucket(tx); r.Seq > q.Sequence() {
				if err := q.SetSequence(r.Seq); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReconcileAfterCrash(t *testing.T) {
	t.Parallel()
	now := time.Now()
	crashed := func(id string, attempts int, seq uint64) Run {
		return Run{ID: id, MessageID: "m-" + id, Agent: "alpha", Connector: "hook", State: StateRunning,
			Backend: "landlock", Handle: "pid:" + id, Attempts: attempts, Seq: seq, CreatedAt: now, StartedAt: now}
	}
	t.Run("Interrupted_run_is_killed_and_requeued_before_later_runs", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		later := Run{ID: "r2", MessageID: "m-r2", Agent: "alpha", State: StateQueued, Seq: 9, CreatedAt: now}
		writeRuns(t, dir, crashed("r1", 1, 3), later)
		b := newGateBackend("landlock")
		s := newTestService(t, testConfig(4), dir, b, nil)
		start(t, s)
		first := b.next(t)
		if first.spec.RunID != "r1" {
			t.Fatalf("first run started is %s, want the interrupted r1", first.spec.RunID)
		}
		if _, _, killed := b.stats(); !slices.Equal(killed, []string{"pid:r1"}) {
			t.Fatalf("killed %v, want [pid:r1]", killed)
		}
		if r := waitState(t, s, "r1", StateRunning); r.Attempts != 2 {
			t.Fatalf("attempts = %d, want 2", r.Attempts)
		}
		first.reply("done")
		b.next(t).reply("done")
		waitState(t, s, "r2", StateSucceeded)
	})
	t.Run("Run_interrupted_twice_fails_and_is_delivered", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeRuns(t, dir, crashed("r1", 2, 1))
		b := newGateBackend("landlock")
		d := newDeliveries(0)
		s := newTestService(t, testConfig(4), dir, b, d)
		start(t, s)
		if r := waitState(t, s, "r1", StateFailed); r.Reason != isolation.ReasonInterruptedTwice {
			t.Fatalf("reason = %q, want %q", r.Reason, isolation.ReasonInterruptedTwice)
		}
		if _, _, killed := b.stats(); !slices.Equal(killed, []string{"pid:r1"}) {
			t.Fatalf("killed %v, want [pid:r1]", killed)
		}
		waitDeliveredTo(t, s, d, "r1")
		b.none(t, s)
	})
}

// waitDeliveredTo waits until run id is marked delivered and returns what
// the deliverer got for it.
func waitDeliveredTo(t *testing.T, s *Service, d *deliveries, id string) busapi.Reply {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := s.GetRun(id)
		if err == nil && r.Delivered {
			_, got := d.snapshot()
			for _, reply := range got {
				if reply.RunID == id {
					return reply
				}
			}
			t.Fatalf("run %s is marked delivered but the deliverer never got it", id)
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s not delivered within 10s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDeliveriesAreRetriedUntilAcceptedAndNotRepeated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := newGateBackend("landlock")
	failing := newDeliveries(1 << 30)
	s := newTestService(t, testConfig(4), dir, b, failing)
	id := submit(t, s, "m1", "alpha", "connector", "hook")
	quiet := submit(t, s, "m2", "beta") // from berthctl send: no connector
	stop := start(t, s)
	for range 2 {
		b.next(t).reply("answer")
	}
	waitState(t, s, quiet, StateSucceeded)
	for range 3 { // first try and two retries
		<-failing.notify
	}
	stop()
	if r, _ := s.GetRun(id); r.Delivered {
		t.Fatal("run is marked delivered although every delivery failed")
	}
	if r, _ := s.GetRun(quiet); !r.Delivered {
		t.Fatal("run without connector is not marked delivered")
	}
	s.Close()

	// The next scheduler delivers it, after intake failed twice more.
	flaky := newDeliveries(2)
	s = newTestService(t, testConfig(4), dir, b, flaky)
	stop = start(t, s)
	reply := waitDeliveredTo(t, s, flaky, id)
	if reply.Text != "answer" || reply.MessageID != "m1" || reply.State != StateSucceeded || reply.Agent != "alpha" {
		t.Fatalf("delivered %+v", reply)
	}
	if calls, got := flaky.snapshot(); calls != 3 || len(got) != 1 {
		t.Fatalf("deliverer called %d times with %d accepted, want 3 calls, 1 accepted (the run without connector is never delivered)", calls, len(got))
	}
	stop()
	s.Close()

	// Nothing is pending any more, so nothing can be delivered again.
	again := newDeliveries(0)
	s = newTestService(t, testConfig(4), dir, b, again)
	if pending := pendingDeliveries(t, s); len(pending) != 0 {
		t.Fatalf("delivered runs are pending again after reopen: %v", pending)
	}
}
