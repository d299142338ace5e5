package intake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it owns berth's bus names and acts as user nobody")
	}
}

// exportOnPrivateBus starts a private bus and exports s on it.
func exportOnPrivateBus(t *testing.T, s *Service) *testbus.Bus {
	t.Helper()
	needRoot(t)
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return b
}

func intakeProxy(conn *dbus.Conn) dbus.BusObject {
	return conn.Object(bus.IntakeName, bus.IntakePath)
}

func pendingProperty(t *testing.T, conn *dbus.Conn, name string) uint32 {
	t.Helper()
	v, err := intakeProxy(conn).GetProperty(bus.IntakeInterface + "." + name)
	if err != nil {
		t.Fatalf("cannot read %s: %v", name, err)
	}
	n, ok := v.Value().(uint32)
	if !ok {
		t.Fatalf("%s is %s, want u", name, v.Signature())
	}
	return n
}

// fakeScheduler answers dev.berth.Scheduler1.Submit like the scheduler: the
// same id gets the same run.
type fakeScheduler struct {
	mu    sync.Mutex
	calls map[string]int
	runs  map[string]string
}

func (f *fakeScheduler) Submit(msg map[string]string) (string, *dbus.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[msg["id"]]++
	if msg["id"] == "" || msg["agent"] == "" {
		return "", bus.NewError(bus.ErrInvalidArgument, "id and agent are required")
	}
	if run, ok := f.runs[msg["id"]]; ok {
		return run, nil
	}
	run := fmt.Sprintf("run-%d", len(f.runs)+1)
	f.runs[msg["id"]] = run
	return run, nil
}

func TestForwarderRetriesUntilTheSchedulerAppears(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	runService(t, s)
	client := b.Conn(t)

	ids := []string{"a1", "a2", "a3"}
	for _, id := range ids {
		body := []byte(`{"id":"` + id + `","channel":"ops","author":"ada","text":"hi"}`)
		if status, out := post(t, s, signedRequest("hooks", body, testSecret, time.Now())); status != http.StatusAccepted {
			t.Fatalf("post %s: %d %v", id, status, out)
		}
	}
	// The messages are one agent's: the first is retried, the others wait
	// behind it so that they cannot overtake it.
	eventually(t, "the first message has failed to submit at least twice", func() bool {
		n, _ := s.submitFailures("hooks", ids[0])
		return n >= 2
	})
	if _, lastErr := s.submitFailures("hooks", ids[0]); !strings.Contains(lastErr, "dev.berth.Scheduler1") {
		t.Errorf("last error = %q, want it to name the scheduler", lastErr)
	}
	if n := pendingProperty(t, client, "InboxPending"); n != uint32(len(ids)) {
		t.Fatalf("InboxPending = %d while nobody owns the scheduler name, want %d", n, len(ids))
	}

	sched := &fakeScheduler{calls: map[string]int{}, runs: map[string]string{}}
	schedConn := b.Conn(t)
	if err := schedConn.Export(sched, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := schedConn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.SchedulerName, reply, err)
	}

	eventually(t, "every message is submitted", func() bool {
		pending, _ := s.store.pendingMessages()
		return len(pending) == 0
	})
	// A submitted message has left the pending index, which is all the
	// forward loop reads: it cannot be submitted again.
	sched.mu.Lock()
	defer sched.mu.Unlock()
	for _, id := range ids {
		key := "hooks/" + id
		if sched.calls[key] != 1 {
			t.Errorf("scheduler got %d Submit calls for %s, want 1", sched.calls[key], key)
		}
		m, _, _ := s.store.message("hooks", id)
		if m.State != stateSubmitted || m.RunID != sched.runs[key] {
			t.Errorf("message %s = %s run %q, want submitted with run %q", id, m.State, m.RunID, sched.runs[key])
		}
	}
	sched.mu.Unlock()
	eventually(t, "InboxPending drops to 0", func() bool { return pendingProperty(t, client, "InboxPending") == 0 })
	sched.mu.Lock()
}

// replyServer records posts to a reply_url and fails the first failFirst.
type replyServer struct {
	*httptest.Server
	mu        sync.Mutex
	failFirst int
	attempts  int
	accepted  []replyPost
	problems  []string
}

func newReplyServer(t *testing.T, failFirst int) *replyServer {
	rs := &replyServer{failFirst: failFirst}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rs.mu.Lock()
		defer rs.mu.Unlock()
		rs.attempts++
		if err := verifySignature(r.Header, []byte(testSecret), time.Now(), body); err != nil {
			rs.problems = append(rs.problems, "signature: "+err.Error())
		}
		if rs.attempts <= rs.failFirst {
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		var p replyPost
		if err := json.Unmarshal(body, &p); err != nil {
			rs.problems = append(rs.problems, "body: "+err.Error())
		}
		rs.accepted = append(rs.accepted, p)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rs.Close)
	return rs
}

func (rs *replyServer) counts() (attempts, accepted int) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.attempts, len(rs.accepted)
}

func TestDeliverOverDBusPostsTheReplyUntilThePlatformTakesIt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		failFirst    int
		delivers     int
		wantAttempts int
	}{
		{"Reply_is_retried_after_two_server_errors", 2, 1, 3},
		{"Reply_delivered_twice_is_posted_once", 0, 2, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs := newReplyServer(t, tc.failFirst)
			s, _ := newTestService(t, testConfig(rs.URL))
			b := exportOnPrivateBus(t, s)
			runService(t, s)
			client := b.Conn(t)

			if status, out := post(t, s, signedRequest("hooks", []byte(`{"id":"m-1","channel":"ops","thread":"t-7","author":"ada","text":"status?"}`), testSecret, time.Now())); status != http.StatusAccepted {
				t.Fatalf("post: %d %v", status, out)
			}
			reply := map[string]string{
				"run_id": "run-42", "message_id": "hooks/m-1", "connector": "hooks",
				"state": "succeeded", "text": "all green", "error": "",
			}
			for i := range tc.delivers {
				if err := intakeProxy(client).Call(bus.IntakeInterface+".Deliver", 0, reply).Err; err != nil {
					t.Fatalf("Deliver %d: %v", i+1, err)
				}
			}
			eventually(t, "the reply is delivered", func() bool {
				_, accepted := rs.counts()
				return accepted > 0 && pendingProperty(t, client, "OutboxPending") == 0
			})
			// A delivered reply has left the pending index, which is all
			// the reply worker reads: it cannot be posted again.
			rs.mu.Lock()
			defer rs.mu.Unlock()
			if rs.attempts != tc.wantAttempts || len(rs.accepted) != 1 {
				t.Fatalf("reply server saw %d posts and took %d, want %d and 1", rs.attempts, len(rs.accepted), tc.wantAttempts)
			}
			if len(rs.problems) > 0 {
				t.Fatalf("reply server found problems: %v", rs.problems)
			}
			want := replyPost{ID: "m-1", RunID: "run-42", Channel: "ops", Thread: "t-7", Agent: "ops-agent", State: "succeeded", Text: "all green"}
			if !reflect.DeepEqual(rs.accepted[0], want) {
				t.Fatalf("posted reply = %+v, want %+v", rs.accepted[0], want)
			}
			replies := outboxEntries(t, s)
			if len(replies) != 1 || replies[0].State != stateDelivered || replies[0].Attempts != tc.wantAttempts || replies[0].DeliveredAt.IsZero() {
				t.Fatalf("outbox = %+v, want one delivered reply after %d attempts", replies, tc.wantAttempts)
			}
		})
	}
}

func outboxEntries(t *testing.T, s *Service) []outboxEntry {
	t.Helper()
	var out []outboxEntry
	err := s.store.db.View(func(tx *bolt.Tx) error {
		replies, _, _ := outboxBuckets(tx)
		return replies.ForEach(func(_, v []byte) error {
			var r outboxEntry
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReplyForConnectorWithoutReplyURLIsDropped(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	runService(t, s)
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-1", "message_id": "m", "connector": "strict", "text": "x"})); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reply is marked delivered", func() bool {
		r := outboxEntries(t, s)
		return len(r) == 1 && r[0].State == stateDelivered
	})
}

func TestDeliverRefusesBadReplies(t *testing.T) {
	t.Parallel()
	s, path := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	client := b.Conn(t)
	full := map[string]string{"run_id": "run-1", "message_id": "m", "connector": "hooks"}
	without := func(key string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			if k != key {
				m[k] = v
			}
		}
		return m
	}
	tests := []struct {
		name  string
		reply map[string]string
	}{
		{"Reply_without_run_id_is_invalid", without("run_id")},
		{"Reply_without_message_id_is_invalid", without("message_id")},
		{"Reply_without_connector_is_invalid", without("connector")},
		{"Reply_for_an_unknown_connector_is_invalid", map[string]string{"run_id": "run-1", "message_id": "m", "connector": "nope"}},
		{"Reply_with_a_slash_in_its_run_id_is_invalid", map[string]string{"run_id": "run/1", "message_id": "m", "connector": "hooks"}},
	}
	t.Run("group", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				err := intakeProxy(client).Call(bus.IntakeInterface+".Deliver", 0, tc.reply).Err
				if got := bus.ErrorName(err); got != bus.ErrInvalidArgument {
					t.Fatalf("Deliver error = %v (%s), want %s", err, got, bus.ErrInvalidArgument)
				}
			})
		}
	})
	s.Close()
	if n := countEntries(t, path)["outbox/replies"]; n != 0 {
		t.Fatalf("outbox holds %d replies after refusals, want 0", n)
	}
}

func TestDeliverFromAnUnprivilegedUserIsRefused(t *testing.T) {
	t.Parallel()
	deliverArgs := []string{"call", bus.IntakeName, string(bus.IntakePath), bus.IntakeInterface, "Deliver",
		"a{ss}", "3", "run_id", "run-1", "message_id", "m", "connector", "hooks"}
	tests := []struct {
		name string
		// letThrough adds a bus policy that lets nobody call Deliver, so
		// that the service's own check is what refuses.
		letThrough bool
		want       string
	}{
		{"Bus_policy_refuses_nobody", false, "Access denied"},
		{"Service_refuses_nobody_when_the_bus_lets_the_call_through", true, "is not root and not in group " + bus.AdminGroup},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, path := newTestService(t, testConfig(""))
			b := exportOnPrivateBus(t, s)
			if tc.letThrough {
				allowNobodyToCallIntake(t, b)
			}
			out := b.BusctlAs(t, "nobody", deliverArgs...)
			if !strings.Contains(out, tc.want) {
				t.Fatalf("busctl as nobody said %q, want it to contain %q", out, tc.want)
			}
			s.Close()
			if n := countEntries(t, path)["outbox/replies"]; n != 0 {
				t.Fatalf("outbox holds %d replies after a refused Deliver, want 0", n)
			}
		})
	}
}

func allowNobodyToCallIntake(t *testing.T, b *testbus.Bus) {
	t.Helper()
	policy := `<busconfig>
  <policy user="nobody">
    <allow send_destination="` + bus.IntakeName + `"/>
  </policy>
</busconfig>
`
	if err := os.WriteFile(filepath.Join(b.Dir, "system.d", "zz-test-nobody.conf"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Conn(t).BusObject().Call("org.freedesktop.DBus.ReloadConfig", 0).Err; err != nil {
		t.Fatalf("cannot reload bus config: %v", err)
	}
}

func TestExport(t *testing.T) {
	t.Parallel()
	t.Run("group", func(t *testing.T) {
		s, _ := newTestService(t, testConfig(""))
		b := exportOnPrivateBus(t, s)

		t.Run("Introspection_shows_the_interface_and_the_standard_ones", func(t *testing.T) {
			t.Parallel()
			var xmlText string
			if err := intakeProxy(b.Conn(t)).Call("org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&xmlText); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				`interface name="dev.berth.Intake1"`, `method name="Deliver"`, `property name="InboxPending" type="u" access="read"`,
				`interface name="org.freedesktop.DBus.Properties"`, `interface name="org.freedesktop.DBus.Introspectable"`,
				`interface name="org.freedesktop.DBus.Peer"`,
			} {
				if !strings.Contains(xmlText, want) {
					t.Errorf("introspection lacks %s:\n%s", want, xmlText)
				}
			}
		})
		t.Run("Anyone_may_read_the_counters", func(t *testing.T) {
			t.Parallel()
			out := b.BusctlAs(t, "nobody", "get-property", bus.IntakeName, string(bus.IntakePath), bus.IntakeInterface, "OutboxPending")
			if strings.TrimSpace(out) != "u 0" {
				t.Fatalf("busctl get-property as nobody said %q, want \"u 0\"", out)
			}
		})
		t.Run("Second_service_cannot_take_the_name", func(t *testing.T) {
			t.Parallel()
			other, _ := newTestService(t, testConfig(""))
			err := other.Export(b.Conn(t))
			if err == nil || !strings.Contains(err.Error(), "another process owns it") {
				t.Fatalf("second Export error = %v, want 'another process owns it'", err)
			}
		})
	})
}
