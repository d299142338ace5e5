package scheduler

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// progressBackend runs each spec through isolation.Supervise in a sandbox
// whose agent writes the log lines it is handed on logs, one write each,
// until logs is closed; then it answers.
type progressBackend struct {
	logs chan string
}

func (b *progressBackend) Name() string                       { return "landlock" }
func (b *progressBackend) Kill(context.Context, string) error { return nil }
func (b *progressBackend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	return isolation.Supervise(ctx, spec, func(_ context.Context, spec isolation.Spec, _ []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
		return &talkingSandbox{logs: b.logs, runID: spec.RunID, stdout: stdout, stderr: stderr, drained: make(chan struct{})}, nil
	})
}

type talkingSandbox struct {
	logs           chan string
	runID          string
	stdout, stderr io.Writer
	drained        chan struct{}
	once           sync.Once
}

func (s *talkingSandbox) Handle() string { return "talking:" + s.runID }
func (s *talkingSandbox) Wait(ctx context.Context) (isolation.Exit, error) {
	for line := range s.logs {
		io.WriteString(s.stderr, line)
	}
	fmt.Fprintf(s.stdout, `{"version":1,"run_id":%q,"reply":"all done"}`+"\n", s.runID)
	s.Release()
	return isolation.Exit{}, nil
}
func (s *talkingSandbox) Kill(context.Context) error         { return nil }
func (s *talkingSandbox) Drained() <-chan struct{}           { return s.drained }
func (s *talkingSandbox) Inspect(context.Context, bool) bool { return false }
func (s *talkingSandbox) Release()                           { s.once.Do(func() { close(s.drained) }) }

func toolLine(seq int, text string) string {
	return fmt.Sprintf(`{"level":"INFO","msg":"progress","progress":{"seq":%d,"tool":"shell","text":%q}}`+"\n", seq, text)
}

// nextProgress returns the next RunProgress, advancing the fake clock
// while none has come (the relay may be waiting out its second).
func nextProgress(t *testing.T, ch <-chan busapi.RunProgress, clock *clockwork.FakeClock) (busapi.RunProgress, time.Time) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case p := <-ch:
			return p, clock.Now()
		case <-deadline:
			t.Fatal("no RunProgress within 20s")
		case <-time.After(20 * time.Millisecond):
			clock.Advance(100 * time.Millisecond)
		}
	}
}

func TestRunProgress_reaches_intake_alone_coalesced_and_at_most_once_a_second(t *testing.T) {
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	clock := clockwork.NewFakeClock()
	backend := &progressBackend{logs: make(chan string)}
	s := newTestService(t, testConfig(4), "", newGateBackend("unused"), nil, withClock(clock), func(o *Options) {
		o.Backends = map[string]isolation.Backend{"landlock": backend}
	})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}

	// The test's intake owns dev.berth.Intake1; another client listens for
	// every signal of the scheduler.
	intake := b.Conn(t)
	if reply, err := intake.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("RequestName(%s) = %v, %v", bus.IntakeName, reply, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	progress := busapi.WatchRunProgress(ctx, intake)
	bystander := b.Conn(t)
	overheard := signals(t, bystander)

	// The id as intake sends it: the message's key, its connector's prefix
	// included (busapi.Submission.Key). The signal names the same key.
	id := submit(t, s, busapi.MessageKey("slack", "m1"), "alpha", "connector", "slack", "text", "/sh pytest")
	start(t, s)

	backend.logs <- toolLine(1, "running `pytest`")
	first, firstAt := nextProgress(t, progress, clock)
	want := busapi.RunProgress{RunID: id, MessageKey: busapi.MessageKey("slack", "m1"), Seq: 1, Text: "running `pytest`"}
	if first != want {
		t.Fatalf("first RunProgress = %+v, want %+v", first, want)
	}
	for seq := 2; seq <= 5; seq++ {
		backend.logs <- toolLine(seq, fmt.Sprintf("step %d", seq))
	}
	second, secondAt := nextProgress(t, progress, clock)
	if second.Seq != 5 || second.Text != "step 5" {
		t.Fatalf("second RunProgress = %+v, want the latest (seq 5): progress is coalesced", second)
	}
	if gap := secondAt.Sub(firstAt); gap < runProgressEvery {
		t.Fatalf("second RunProgress %s after the first (fake clock), want at least %s", gap, runProgressEvery)
	}
	close(backend.logs)
	waitFinished(t, s, id)

	// The bystander hears RunFinished, sent after every RunProgress of the
	// run, and none of them before it.
	for {
		select {
		case sig := <-overheard:
			if strings.HasSuffix(sig.Name, ".RunProgress") {
				t.Fatalf("a client that is not intake received %s %v", sig.Name, sig.Body)
			}
			if strings.HasSuffix(sig.Name, ".RunFinished") && len(sig.Body) > 0 && sig.Body[0] == id {
				select {
				case p := <-progress:
					t.Fatalf("RunProgress after the run finished: %+v", p)
				default:
				}
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no RunFinished within 20s")
		}
	}
}

func TestRunProgress_from_another_connection_is_not_believed(t *testing.T) {
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	s := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	intake := b.Conn(t)
	if reply, err := intake.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("RequestName(%s) = %v, %v", bus.IntakeName, reply, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	progress := busapi.WatchRunProgress(ctx, intake)

	forger := b.Conn(t)
	for seq := uint32(1); seq <= 3; seq++ {
		if err := busapi.SendRunProgress(forger, busapi.RunProgress{RunID: "r1", MessageKey: "slack/m1", Seq: seq, Text: "forged"}); err != nil {
			t.Fatalf("SendRunProgress: %v", err)
		}
	}
	// Once intake's connection answered a ping sent after them, the
	// forgeries are ahead of anything the scheduler sends next.
	if err := forger.Object(intake.Names()[0], "/").Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("Ping: %v", err)
	}
	legit := busapi.RunProgress{RunID: "r2", MessageKey: "slack/m2", Seq: 1, Text: "running `ls`"}
	if err := busapi.SendRunProgress(s.bus(), legit); err != nil {
		t.Fatalf("SendRunProgress: %v", err)
	}
	select {
	case p := <-progress:
		if p != legit {
			t.Fatalf("first RunProgress passed on = %+v, want the scheduler's %+v: a forgery was believed", p, legit)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the scheduler's RunProgress did not arrive within 20s")
	}
}
