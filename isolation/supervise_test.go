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
