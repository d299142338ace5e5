package isolation_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// scripted is a sandbox that ends as told: with exit when it is not killed
// first, or never (hang) until Kill. Its output drains on exit, or only on
// Release when stuck is set (a grandchild holding the pipes).
type scripted struct {
	exit    isolation.Exit
	hang    bool
	stuck   bool
	oom     bool
	stdout  string
	out     io.Writer
	killed  chan struct{}
	drained chan struct{}
	once    sync.Once
	mu      sync.Mutex
	kills   int
}

func (s *scripted) Handle() string { return "scripted:1" }
func (s *scripted) Wait(ctx context.Context) (isolation.Exit, error) {
	if s.hang {
		<-s.killed
		return isolation.Exit{Code: -1, Signal: syscall.SIGKILL}, nil
	}
	io.WriteString(s.out, s.stdout)
	if !s.stuck {
		s.once.Do(func() { close(s.drained) })
	}
	return s.exit, nil
}
func (s *scripted) Kill(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kills == 0 {
		close(s.killed)
		if s.hang && !s.stuck {
			s.once.Do(func() { close(s.drained) })
		}
	}
	s.kills++
	return nil
}
func (s *scripted) Drained() <-chan struct{}           { return s.drained }
func (s *scripted) Inspect(context.Context, bool) bool { return s.oom }
func (s *scripted) Release()                           { s.once.Do(func() { close(s.drained) }) }

func TestSuperviseMapsWhatHappenedToOneReason(t *testing.T) {
	t.Parallel()
	good := `{"version":1,"run_id":"r1","reply":"hi"}`
	tests := []struct {
		name     string
		sandbox  *scripted
		timeout  time.Duration
		onStart  error
		cancel   bool
		reason   string
		detail   string
		wantKill bool
	}{
		{"A_response_is_a_result", &scripted{stdout: good}, 0, nil, false, "", "", true},
		{"An_OOM_kill_reported_by_the_sandbox_is_out_of_memory", &scripted{exit: isolation.Exit{Code: -1, Signal: syscall.SIGKILL, OOM: true}}, 0, nil, false, isolation.ReasonOutOfMemory, "memory limit of 64m", true},
		{"An_OOM_kill_found_on_inspection_is_out_of_memory", &scripted{exit: isolation.Exit{Code: 137}, oom: true}, 0, nil, false, isolation.ReasonOutOfMemory, "memory limit", true},
		{"A_signal_is_a_crash", &scripted{exit: isolation.Exit{Code: -1, Signal: syscall.SIGSEGV}}, 0, nil, false, isolation.ReasonCrashed, "segmentation fault", true},
		{"A_sandbox_that_never_ran_the_agent_cannot_start", &scripted{exit: isolation.Exit{Code: 203, NeverRan: "exec failed"}}, 0, nil, false, isolation.ReasonStart, "exec failed", true},
		{"Overrunning_the_timeout_kills_and_says_timeout", &scripted{hang: true}, 50 * time.Millisecond, nil, false, isolation.ReasonTimeout, "killed after 50ms", true},
		{"Cancel_kills_and_says_canceled", &scripted{hang: true}, 0, nil, true, isolation.ReasonCanceled, "", true},
		{"A_handle_that_cannot_be_recorded_kills_at_once", &scripted{hang: true}, 0, errors.New("disk full"), false, isolation.ReasonUntracked, "disk full", true},
		{"Output_held_open_is_drained_only_for_the_grace_period", &scripted{stdout: good, stuck: true}, 0, nil, false, "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb := tc.sandbox
			sb.killed, sb.drained = make(chan struct{}), make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Timeout: tc.timeout, KillGrace: 100 * time.Millisecond, Limits: isolation.Limits{MemoryBytes: 64 << 20}}}
			var handle string
			spec.OnStart = func(h string) error {
				handle = h
				if tc.cancel {
					cancel()
				}
				return tc.onStart
			}
			res, err := isolation.Supervise(ctx, spec, func(_ context.Context, _ isolation.Spec, input []byte, stdout, _ io.Writer) (isolation.Sandbox, error) {
				if !strings.Contains(string(input), `"run_id":"r1"`) {
					t.Errorf("input %s", input)
				}
				sb.out = stdout
				return sb, nil
			})
			if got := isolation.ReasonOf(err); got != tc.reason || (err != nil && !strings.Contains(err.Error(), tc.detail)) {
				t.Fatalf("Supervise = %v, want reason %q with %q", err, tc.reason, tc.detail)
			}
			if tc.reason == "" && res.Response.Reply != "hi" {
				t.Errorf("reply %q", res.Response.Reply)
			}
			if handle != "scripted:1" {
				t.Errorf("OnStart got %q", handle)
			}
			if (sb.kills > 0) != tc.wantKill {
				t.Errorf("killed %d times", sb.kills)
			}
		})
	}
}

func TestSuperviseRefusesARequestForAnotherRun(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1"}}
	spec.Request.RunID = "r2"
	started := false
	_, err := isolation.Supervise(context.Background(), spec, func(context.Context, isolation.Spec, []byte, io.Writer, io.Writer) (isolation.Sandbox, error) {
		started = true
		return nil, errors.New("unreachable")
	})
	if isolation.ReasonOf(err) != isolation.ReasonStart || started {
		t.Fatalf("Supervise = %v (started %v), want a refusal before anything starts", err, started)
	}
}

// agentLog is the stderr of an agent that answers: a log line, then the
// line that says its log is complete.
const agentLog = `{"level":"INFO","msg":"tool call","tool":"shell"}` + "\n" +
	`{"level":"INFO","msg":"` + isolation.ResponseFollows + `","run_id":"r1"}` + "\n"

// answering is a sandbox that may end after its run returned
// (isolation.BackgroundEnder): its agent writes stdout, then stderr (the
// engine may deliver them in either order), as it starts; then its Wait
// returns only when it is killed, or at once with exitWith when
// exitsAtOnce. Kill blocks until killGate is closed, so a test can hold the
// teardown.
type answering struct {
	stdout      string
	stderr      string
	exitsAtOnce bool
	exitWith    isolation.Exit
	oom         bool

	killGate  chan struct{} // Kill waits for it
	killed    chan struct{}
	drained   chan struct{}
	released  chan struct{}
	tornDown  chan error // what the teardown returned
	mu        sync.Mutex
	kills     int
	handedOff bool
	once      sync.Once
	relOnce   sync.Once
}

func newAnswering(stdout string) *answering {
	return &answering{stdout: stdout, stderr: agentLog, killGate: make(chan struct{}), killed: make(chan struct{}),
		drained: make(chan struct{}), released: make(chan struct{}), tornDown: make(chan error, 1)}
}

func (s *answering) start(_ context.Context, _ isolation.Spec, _ []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
	// Complete before Supervise looks.
	io.WriteString(stdout, s.stdout)
	io.WriteString(stderr, s.stderr)
	return s, nil
}

func (s *answering) Handle() string { return "answering:1" }
func (s *answering) Wait(ctx context.Context) (isolation.Exit, error) {
	if s.exitsAtOnce {
		s.once.Do(func() { close(s.drained) })
		return s.exitWith, nil
	}
	<-s.killed
	s.once.Do(func() { close(s.drained) })
	return isolation.Exit{Code: -1, Signal: syscall.SIGKILL}, nil
}
func (s *answering) Kill(context.Context) error {
	<-s.killGate
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kills == 0 {
		close(s.killed)
	}
	s.kills++
	return nil
}
func (s *answering) Drained() <-chan struct{}           { return s.drained }
func (s *answering) Inspect(context.Context, bool) bool { return s.oom }
func (s *answering) Release() {
	s.relOnce.Do(func() { close(s.released) })
	s.once.Do(func() { close(s.drained) })
}
func (s *answering) EndsInBackground(teardown func() error) {
	s.mu.Lock()
	s.handedOff = true
	s.mu.Unlock()
	go func() { s.tornDown <- teardown() }()
}

func (s *answering) wasHandedOff() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handedOff
}

// supervised runs Supervise on sb in the background.
func supervised(spec isolation.Spec, sb *answering) <-chan supervisedRun {
	done := make(chan supervisedRun, 1)
	go func() {
		res, err := isolation.Supervise(context.Background(), spec, sb.start)
		done <- supervisedRun{res, err}
	}()
	return done
}

type supervisedRun struct {
	res isolation.Result
	err error
}

// returned waits for Supervise; it fails the test when Supervise is still
// waiting after a minute (it would be waiting for what the test holds).
func returned(t *testing.T, done <-chan supervisedRun, holding string) supervisedRun {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(time.Minute):
		t.Fatalf("Supervise has not returned while %s", holding)
		return supervisedRun{}
	}
}

func TestAnAnsweredRunReturnsWhileItsSandboxIsStillBeingTornDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		stdout   string
		wantCode int
		wantErr  string
	}{
		{"A_reply_returns_with_exit_code_0", `{"version":1,"run_id":"r1","reply":"hi sk-berth-SECRET-1"}` + "\n", 0, ""},
		{"An_agent_error_returns_with_exit_code_1", `{"version":1,"run_id":"r1","reply":"hi","error":"max iterations reached"}` + "\n", 1, "max iterations reached"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb := newAnswering(tc.stdout)
			spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", KillGrace: time.Minute,
				Providers: []agentproto.Provider{{Name: "openai", Kind: "openai", Key: "sk-berth-SECRET-1"}}}}
			// The agent never exits by itself and Kill is held: the run can
			// only return before its sandbox ended.
			r := returned(t, supervised(spec, sb), "the sandbox is neither exited nor killed")
			if r.err != nil || r.res.Response.Error != tc.wantErr || r.res.ExitCode != tc.wantCode {
				t.Fatalf("Supervise = %+v, %v; want the response with exit code %d", r.res, r.err, tc.wantCode)
			}
			if !strings.Contains(r.res.Stderr, `"msg":"tool call"`) {
				t.Fatalf("stderr tail %q: want the agent's whole log", r.res.Stderr)
			}
			if strings.Contains(r.res.Response.Reply, "SECRET") {
				t.Fatalf("reply %q carries the provider key", r.res.Response.Reply)
			}
			if !sb.wasHandedOff() || isClosed(sb.released) {
				t.Fatalf("handed off %v, released %v: want the sandbox's end handed to the backend, not done", sb.wasHandedOff(), isClosed(sb.released))
			}
			close(sb.killGate)
			if err := <-sb.tornDown; err != nil {
				t.Fatalf("teardown: %v", err)
			}
			if !isClosed(sb.released) || sb.kills != 1 {
				t.Fatalf("after the teardown: released %v, killed %d times; want released and killed once", isClosed(sb.released), sb.kills)
			}
		})
	}
}

func TestAnAgentThatHangsAfterAnsweringIsKilledAndTheRunKeepsItsReply(t *testing.T) {
	t.Parallel()
	sb := newAnswering(`{"version":1,"run_id":"r1","reply":"hi"}` + "\n")
	close(sb.killGate)
	r := returned(t, supervised(isolation.Spec{Plan: isolation.Plan{RunID: "r1"}}, sb), "the agent hangs")
	if r.err != nil || r.res.Response.Reply != "hi" {
		t.Fatalf("Supervise = %+v, %v; want the reply", r.res, r.err)
	}
	if err := <-sb.tornDown; err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if !isClosed(sb.killed) || !isClosed(sb.released) {
		t.Fatal("the hanging agent was not killed and released after the run returned")
	}
}

func TestAnOOMKillFoundAfterTheAnswerIsReportedByTheTeardown(t *testing.T) {
	t.Parallel()
	sb := newAnswering(`{"version":1,"run_id":"r1","reply":"hi"}` + "\n")
	sb.oom = true
	close(sb.killGate)
	r := returned(t, supervised(isolation.Spec{Plan: isolation.Plan{RunID: "r1"}}, sb), "the agent hangs")
	if r.err != nil {
		t.Fatalf("Supervise: %v", r.err)
	}
	if err := <-sb.tornDown; err == nil || !strings.Contains(err.Error(), "OOM-killed") {
		t.Fatalf("teardown = %v, want the OOM kill reported", err)
	}
}

// A run whose complete stdout cannot stand for its end waits for the exit
// and is judged as before.
func TestARunWhoseAnswerDoesNotStandEndsTheWayItDidBefore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stdout string
		stderr string
		oom    bool
		exit   isolation.Exit
		reason string
	}{
		{"A_response_without_the_agents_last_log_line_is_taken_at_the_exit", `{"version":1,"run_id":"r1","reply":"hi"}` + "\n", "an older agent's log\n", false, isolation.Exit{Code: 0}, ""},
		{"A_response_for_another_run_is_a_bad_response", `{"version":1,"run_id":"r2","reply":"hi"}` + "\n", agentLog, false, isolation.Exit{Code: 0}, isolation.ReasonBadResponse},
		{"A_line_that_is_not_JSON_is_a_bad_response", "not json\n", agentLog, false, isolation.Exit{Code: 0}, isolation.ReasonBadResponse},
		{"A_tool_killed_by_SIGKILL_in_an_OOM_killed_sandbox_is_out_of_memory",
			`{"version":1,"run_id":"r1","reply":"hi","tool_calls":[{"name":"sh","output":"{\"exit_code\":137}"}]}` + "\n", agentLog, true, isolation.Exit{Code: 0}, isolation.ReasonOutOfMemory},
		// The engine's oom event may never come under load; the agent's
		// own count of its cgroup's OOM kills is enough.
		{"A_tool_killed_by_SIGKILL_that_the_agent_counted_as_OOM_killed_is_out_of_memory_though_the_sandbox_says_nothing",
			`{"version":1,"run_id":"r1","reply":"hi","tool_calls":[{"name":"sh","output":"{\"exit_code\":137}"}],"oom_kills":1}` + "\n", agentLog, false, isolation.Exit{Code: 0}, isolation.ReasonOutOfMemory},
		{"An_OOM_kill_the_agent_counted_is_out_of_memory_even_when_no_tool_call_shows_it",
			`{"version":1,"run_id":"r1","reply":"hi","oom_kills":2}` + "\n", agentLog, false, isolation.Exit{Code: 0}, isolation.ReasonOutOfMemory},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Its stdout is complete before its exit is reported, as with
			// berth-agent in a container: Supervise looks at the answer first.
			sb := newAnswering(tc.stdout)
			sb.stderr, sb.oom, sb.exitsAtOnce, sb.exitWith = tc.stderr, tc.oom, true, tc.exit
			close(sb.killGate)
			r := returned(t, supervised(isolation.Spec{Plan: isolation.Plan{RunID: "r1", Limits: isolation.Limits{MemoryBytes: 64 << 20}}}, sb), "the agent has exited")
			if isolation.ReasonOf(r.err) != tc.reason || (tc.reason == "" && r.res.Response.Reply != "hi") {
				t.Fatalf("Supervise = %+v, %v; want reason %q", r.res, r.err, tc.reason)
			}
			if sb.wasHandedOff() {
				t.Fatal("the sandbox's end was handed off for a run that was not answered")
			}
		})
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
