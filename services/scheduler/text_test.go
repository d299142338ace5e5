package scheduler

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

func TestCleanTextMakesAnyTextSendable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"Plain_text_is_kept", "héllo ✓", "héllo ✓"},
		{"NUL_becomes_the_replacement_character", "a\x00b", "a\uFFFDb"},
		{"Invalid_UTF8_becomes_the_replacement_character", "a\xff\xfeb", "a\uFFFDb"},
		{"Both_together", "\x00\xc3", "\uFFFD\uFFFD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := cleanText(tc.in); got != tc.want {
				t.Fatalf("cleanText(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// recordingIntake is dev.berth.Intake1 on a private bus: it keeps what
// Deliver was given.
type recordingIntake struct {
	mu      sync.Mutex
	replies []map[string]string
	got     chan struct{}
}

func (r *recordingIntake) Deliver(reply map[string]string) *dbus.Error {
	r.mu.Lock()
	r.replies = append(r.replies, reply)
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	return nil
}

func TestAReplyWithNULAndInvalidUTF8IsDeliveredOverTheBus(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	intakeConn := b.Conn(t)
	intake := &recordingIntake{got: make(chan struct{}, 10)}
	if err := intakeConn.Export(intake, bus.IntakePath, bus.IntakeInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := intakeConn.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.IntakeName, reply, err)
	}

	backend := newGateBackend("landlock")
	schedConn := b.Conn(t)
	s := newTestService(t, testConfig(4), "", backend, BusDeliverer{Conn: schedConn})
	if err := s.Export(schedConn); err != nil {
		t.Fatal(err)
	}
	start(t, s)
	id := submit(t, s, "m1", "alpha", "connector", "hook", "channel", "c\x001")
	run := backend.next(t)
	run.finish <- outcome{res: isolation.Result{
		Response: agentproto.Response{Reply: "hi\x00there \xff end", ToolCalls: []agentproto.ToolCall{{Name: "shell", Output: "bin\x00ary\xfe"}}},
		Stderr:   "log\x00line",
	}}
	select {
	case <-intake.got:
	case <-time.After(10 * time.Second):
		t.Fatal("intake got no reply within 10s")
	}
	intake.mu.Lock()
	got := intake.replies[0]
	intake.mu.Unlock()
	if got["text"] != "hi\uFFFDthere \uFFFD end" || got["run_id"] != id || got["channel"] != "c\uFFFD1" {
		t.Fatalf("delivered %q", got)
	}
	r := waitDelivered(t, s, id)
	if r.State != StateSucceeded {
		t.Fatalf("run state %q, want succeeded", r.State)
	}
	var run2 map[string]dbus.Variant
	if err := scheduler(b.Conn(t)).Call(bus.SchedulerInterface+".GetRun", 0, id).Store(&run2); err != nil {
		t.Fatalf("GetRun over the bus: %v", err)
	}
	if tc := run2["tool_calls"].Value().(string); !strings.Contains(tc, "bin\uFFFDary\uFFFD") {
		t.Fatalf("tool calls = %s", tc)
	}
	if st := run2["stderr_tail"].Value().(string); st != "log\uFFFDline" {
		t.Fatalf("stderr tail = %q", st)
	}
}

// malformedIntake fails every Deliver the way godbus does for a string
// that cannot be sent.
type malformedIntake struct {
	mu    sync.Mutex
	calls int
}

func (m *malformedIntake) Deliver(context.Context, busapi.Reply) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	return dbus.FormatError("input has a null char('\\000') in string")
}

func TestAReplyThatCanNeverBeSentEndsAsFailedAfterBoundedAttempts(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	d := &malformedIntake{}
	s := newTestService(t, testConfig(4), "", b, d)
	start(t, s)
	id := submit(t, s, "m1", "alpha", "connector", "hook")
	b.next(t).reply("answer")
	r := waitDelivered(t, s, id)
	if r.State != StateFailed || r.Reason != isolation.ReasonUndeliverable || r.Reply != "answer" {
		t.Fatalf("run = state %q reason %q reply %q; want failed, %q, reply kept", r.State, r.Reason, r.Reply, isolation.ReasonUndeliverable)
	}
	if pending := pendingDeliveries(t, s); len(pending) != 0 {
		t.Fatalf("still pending: %v", pending)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.calls != maxMalformedAttempts {
		t.Fatalf("Deliver called %d times, want %d", d.calls, maxMalformedAttempts)
	}
}

func TestToolOutputsAreStoredBoundedAndTheReplyWhole(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	start(t, s)
	id := submit(t, s, "m1", "alpha")
	reply := strings.Repeat("r", 2<<20)
	calls := []agentproto.ToolCall{{Name: "big", Output: strings.Repeat("é", 50000), Args: json.RawMessage(`{"cmd":"cat"}`)}}
	for range 30 {
		calls = append(calls, agentproto.ToolCall{Name: "shell", Output: strings.Repeat("x", maxToolOutput)})
	}
	b.next(t).finish <- outcome{res: isolation.Result{Response: agentproto.Response{Reply: reply, ToolCalls: calls}}}
	r := waitState(t, s, id, StateSucceeded)
	if r.Reply != reply {
		t.Fatalf("reply kept %d bytes of %d", len(r.Reply), len(reply))
	}
	var stored []storedToolCall
	if err := json.Unmarshal(r.ToolCalls, &stored); err != nil || len(stored) != len(calls) {
		t.Fatalf("tool calls = %d (%v), want %d", len(stored), err, len(calls))
	}
	first := stored[0]
	if len(first.Output) > maxToolOutput || !first.OutputCut || first.OutputBytes != 100000 || !utf8.ValidString(first.Output) || string(first.Args) != `{"cmd":"cat"}` {
		t.Fatalf("first call stored %d bytes (cut %v, of %d, valid %v, args %s); want at most %d, cut, of 100000", len(first.Output), first.OutputCut, first.OutputBytes, utf8.ValidString(first.Output), first.Args, maxToolOutput)
	}
	total := 0
	for _, c := range stored {
		total += len(c.Output)
	}
	if total > maxToolOutputsRun || !stored[len(stored)-1].OutputCut {
		t.Fatalf("tool outputs total %d bytes (last cut: %v), want at most %d and the last ones cut", total, stored[len(stored)-1].OutputCut, maxToolOutputsRun)
	}
}
