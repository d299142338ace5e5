package intake

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

func TestReplayOfASignedRequestWithoutIDRunsNothingAgain(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	sub := newCountingSubmitter()
	s.submitter.Store(&submitterBox{sub})
	runService(t, s)

	body := mustJSON(t, map[string]string{"channel": "ops", "author": "a", "text": "/sh rm -rf important"})
	ts := time.Now()
	code1, out1 := post(t, s, signedRequest("hooks", body, testSecret, ts))
	// An attacker who captured the request sends it again, unchanged.
	code2, out2 := post(t, s, signedRequest("hooks", body, testSecret, ts))
	if code1 != http.StatusAccepted || code2 != http.StatusAccepted || out1["id"] == "" || out1["id"] != out2["id"] {
		t.Fatalf("replay: %d %v then %d %v, want two 202 with the same id", code1, out1, code2, out2)
	}
	// The same body signed a second later is a new message (the sender meant it).
	_, out3 := post(t, s, signedRequest("hooks", body, testSecret, ts.Add(time.Second)))
	if out3["id"] == out1["id"] {
		t.Fatalf("a newly signed request got the replayed id %q", out3["id"])
	}
	eventually(t, "both messages are submitted", func() bool {
		return sub.callsFor("hooks/"+out1["id"]) >= 1 && sub.callsFor("hooks/"+out3["id"]) >= 1
	})
	if n := sub.callsFor("hooks/" + out1["id"]); n != 1 {
		t.Fatalf("the replayed message was submitted %d times, want 1", n)
	}
}

// refusingSubmitter fails every Submit with err, as a scheduler (or a bus)
// that can never take the message.
type refusingSubmitter struct {
	err   error
	mu    sync.Mutex
	calls int
}

func (r *refusingSubmitter) Submit(context.Context, busapi.Submission) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return "", r.err
}

func TestSubmitThatCanNeverSucceedEndsAsARefusalWithAnErrorReply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		err       error
		wantError string
	}{
		{"Scheduler_refuses_an_unknown_agent", bus.NewError(bus.ErrInvalidArgument, "unknown agent %q", "ops-agent"), `unknown agent "ops-agent"`},
		{"Bus_refuses_the_arguments", dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"Invalid arguments"}), "Invalid arguments"},
		{"A_string_with_a_NUL_cannot_be_encoded", fmt.Errorf("cannot submit to %s: %w", bus.SchedulerName, dbus.FormatError("input has a null char('\\000') in string")), "null char"},
		{"A_string_with_invalid_UTF8_cannot_be_encoded", fmt.Errorf("cannot submit: %w", dbus.FormatError("input has a not-utf8 char in string")), "not-utf8"},
		{"A_message_too_long_for_the_bus", fmt.Errorf("cannot submit: %w", dbus.InvalidMessageError("message is too long")), "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs := newReplyServer(t, 0)
			clock := clockwork.NewFakeClockAt(time.Now())
			s, _ := newTestService(t, testConfig(rs.URL), WithClock(clock))
			sub := &refusingSubmitter{err: tc.err}
			s.submitter.Store(&submitterBox{sub})
			passes := passHook(s)
			runService(t, s)

			body := mustJSON(t, map[string]string{"id": "m1", "channel": "ops", "author": "a", "text": "hi"})
			if code, _ := post(t, s, signedRequest("hooks", body, testSecret, clock.Now())); code != http.StatusAccepted {
				t.Fatalf("post: %d", code)
			}
			eventually(t, "the sender gets an error reply", func() bool { _, ok := rs.counts(); return ok > 0 })
			rs.mu.Lock()
			got := rs.accepted[0]
			rs.mu.Unlock()
			if got.ID != "m1" || got.State != "failed" || !strings.Contains(got.Error, tc.wantError) {
				t.Fatalf("error reply %+v, want a failed reply for m1 whose error mentions %q", got, tc.wantError)
			}
			m, _, err := s.store.message("hooks", "m1")
			if err != nil || m.State != stateRefused || m.Attempts != 1 {
				t.Fatalf("message = %+v (%v), want refused after 1 attempt", m, err)
			}
			if inbox, _ := s.store.pendingCounts(); inbox != 0 {
				t.Fatalf("%d messages still pending", inbox)
			}
			// Far past every retry delay, the forward loop passes and finds
			// nothing to submit.
			passes.drain()
			clock.Advance(time.Hour)
			passes.waitFor(t, "forward")
			sub.mu.Lock()
			calls := sub.calls
			sub.mu.Unlock()
			if calls != 1 {
				t.Fatalf("a message refused for good was submitted %d times, want 1", calls)
			}
		})
	}
}

// A message stored by an older intake that let a NUL through fails on the
// real bus before it leaves the process; it must end as a refusal.
func TestStoredMessageWithANULIsRefusedOverTheRealBus(t *testing.T) {
	t.Parallel()
	rs := newReplyServer(t, 0)
	s, _ := newTestService(t, testConfig(rs.URL))
	b := exportOnPrivateBus(t, s)
	sched := &fakeScheduler{calls: map[string]int{}, runs: map[string]string{}}
	schedConn := b.Conn(t)
	if err := schedConn.Export(sched, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := schedConn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.SchedulerName, reply, err)
	}
	if _, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: "nul-1", Channel: "ops", Author: "ada", Text: "hi\x00there", Agent: "ops-agent", ReceivedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	runService(t, s)
	eventually(t, "the sender gets an error reply", func() bool { _, ok := rs.counts(); return ok > 0 })
	m, _, err := s.store.message("hooks", "nul-1")
	if err != nil || m.State != stateRefused || !strings.Contains(m.LastError, "null char") {
		t.Fatalf("message = %+v (%v), want refused for its NUL", m, err)
	}
	sched.mu.Lock()
	defer sched.mu.Unlock()
	if len(sched.calls) != 0 {
		t.Fatalf("the scheduler got %v, want nothing", sched.calls)
	}
}
