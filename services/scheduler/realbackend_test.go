package scheduler

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testAgentPath != "" {
		os.RemoveAll(filepath.Dir(testAgentPath))
	}
	// Shared by parallel tests, so removed only once they all ended.
	if bin, err := mcpServerBinary(); err == nil && bin != "" {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

var (
	testAgentOnce sync.Once
	testAgentPath string
	testAgentErr  error
)

// testAgent builds the host runner's stand-in for berth-agent (it answers
// "echo X" with X and "sleep" by sleeping) into a directory every user can
// enter, so the landlock backend can run it as nobody.
func testAgent(t *testing.T) string {
	t.Helper()
	testAgentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-scheduler-agent-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			testAgentErr = err
			return
		}
		testAgentPath = filepath.Join(dir, "testagent")
		out, err := exec.Command("go", "build", "-o", testAgentPath, "../../isolation/hostrun/testdata/testagent").CombinedOutput()
		if err != nil {
			testAgentErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	if testAgentErr != nil {
		t.Fatalf("cannot build test agent: %v", testAgentErr)
	}
	return testAgentPath
}

// sharedStateDir is a state dir the run user can traverse (t.TempDir's
// parent is 0700).
func sharedStateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "berth-scheduler-state-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestRunsThroughTheLandlockBackend(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: the landlock backend runs the agent as user nobody")
	}
	agent := testAgent(t)
	tests := []struct {
		name       string
		text       string
		timeout    int
		wantState  string
		wantReason string
		wantReply  string
	}{
		{"Agent_reply_is_stored", "echo hello from the sandbox", 30, StateSucceeded, "", "hello from the sandbox"},
		{"Agent_that_overruns_its_timeout_fails_with_reason_timeout", "sleep", 1, StateFailed, isolation.ReasonTimeout, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(4)
			cfg.Scheduler.AgentBinary = agent
			cfg.Agents[0].ContainerMode.TimeoutSeconds = &tc.timeout
			s, err := New(cfg, sharedStateDir(t), Options{
				Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
				Getenv:   func(string) string { return "" },
				Logger:   quietLog,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			id := submit(t, s, "m1", "alpha", "text", tc.text)
			start(t, s)
			r := waitFinished(t, s, id)
			if r.State != tc.wantState || r.Reason != tc.wantReason || r.Reply != tc.wantReply {
				t.Fatalf("run = state %q reason %q reply %q error %q stderr %q; want %q %q %q",
					r.State, r.Reason, r.Reply, r.Error, r.StderrTail, tc.wantState, tc.wantReason, tc.wantReply)
			}
			if r.Backend != landlock.Name {
				t.Fatalf("backend = %q", r.Backend)
			}
		})
	}
}

func waitFinished(t *testing.T, s *Service, id string) Run {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := s.GetRun(id)
		if err == nil && Finished(r.State) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %q after 20s (err %v)", id, r.State, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// intakeStandIn owns dev.berth.Intake1 and records Deliver calls.
type intakeStandIn struct {
	got chan map[string]string
}

func (i *intakeStandIn) Deliver(reply map[string]string) *dbus.Error {
	i.got <- reply
	return nil
}

func TestBusDelivererCallsIntakeDeliver(t *testing.T) {
	t.Parallel()
	b := testbus.Start(t, testbus.Options{})
	intakeConn := b.Conn(t)
	intake := &intakeStandIn{got: make(chan map[string]string, 1)}
	if err := intakeConn.Export(intake, bus.IntakePath, bus.IntakeInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := intakeConn.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.IntakeName, reply, err)
	}
	d := BusDeliverer{Conn: b.Conn(t)}
	want := ReplyOf(Run{ID: "r1", MessageID: "m1", Connector: "hook", Agent: "alpha", State: StateFailed, Reason: isolation.ReasonTimeout, Error: "timeout: killed"})
	if err := d.Deliver(context.Background(), want); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	got := <-intake.got
	if got["run_id"] != "r1" || got["state"] != StateFailed || got["text"] != "Sorry, this request failed: timeout." || got["error"] != "timeout: killed" {
		t.Fatalf("intake got %v", got)
	}
	intakeConn.ReleaseName(bus.IntakeName)
	if err := d.Deliver(context.Background(), want); err == nil {
		t.Fatal("Deliver succeeded with no intake on the bus")
	}
}
