package intake

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/connector/connectortest"
)

// fakePlatforms builds connectortest connectors for connectors of type
// "fake" and remembers the latest one built for each id.
type fakePlatforms struct {
	mu      sync.Mutex
	latest  map[string]*connectortest.Connector
	builds  map[string]int
	prepare func(id string, c *connectortest.Connector)
}

func newFakePlatforms(prepare func(id string, c *connectortest.Connector)) *fakePlatforms {
	return &fakePlatforms{latest: map[string]*connectortest.Connector{}, builds: map[string]int{}, prepare: prepare}
}

func (f *fakePlatforms) build(c config.Connector, _ *slog.Logger) (connector.Connector, error) {
	fc := connectortest.New(connector.Status{Type: "fake", State: connector.StateConnected})
	if f.prepare != nil {
		f.prepare(c.ID, fc)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latest[c.ID] = fc
	f.builds[c.ID]++
	return fc, nil
}

func (f *fakePlatforms) get(id string) *connectortest.Connector {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.latest[id]
}

func (f *fakePlatforms) buildsOf(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.builds[id]
}

// platformConfig has two fake connectors: alpha (default agent helper) and
// beta (no default), with bindings by channel id, channel name and server.
func platformConfig() *config.Config {
	return &config.Config{
		Connectors: []config.Connector{
			{ID: "alpha", Type: "fake", DefaultAgent: "helper"},
			{ID: "beta", Type: "fake"},
		},
		Bindings: []config.Binding{
			{ChannelID: "C1", Agent: "ops-agent"},
			{ChannelName: "ops-*", Agent: "glob-agent"},
			{ServerID: "S9", Agent: "server-agent"},
		},
	}
}

// recordingSubmitter answers like the scheduler and keeps each Submit's
// arguments. Submits of a connector in hang block until their deadline.
type recordingSubmitter struct {
	mu      sync.Mutex
	msgs    map[string][]map[string]string
	hang    map[string]bool
	release chan struct{} // ends hung Submits early when closed
}

func newRecordingSubmitter(hang ...string) *recordingSubmitter {
	r := &recordingSubmitter{msgs: map[string][]map[string]string{}, hang: map[string]bool{}}
	for _, c := range hang {
		r.hang[c] = true
	}
	return r
}

func (r *recordingSubmitter) Submit(ctx context.Context, sub busapi.Submission) (string, error) {
	msg := sub.Wire()
	r.mu.Lock()
	r.msgs[msg["id"]] = append(r.msgs[msg["id"]], msg)
	hang := r.hang[msg["connector"]]
	r.mu.Unlock()
	if hang {
		select {
		case <-ctx.Done():
		case <-r.release:
		}
		return "", errors.New("no answer")
	}
	return "run-" + strings.ReplaceAll(msg["id"], "/", "-"), nil
}

func (r *recordingSubmitter) submitted(id string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]string(nil), r.msgs[id]...)
}

func startPlatforms(t *testing.T, cfg *config.Config, f *fakePlatforms, opts ...Option) (*Service, string) {
	t.Helper()
	s, path := newTestService(t, cfg, append([]Option{WithConnectorFactory("fake", f.build)}, opts...)...)
	return s, path
}

func waitRunning(t *testing.T, c *connectortest.Connector) {
	t.Helper()
	select {
	case <-c.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("the connector's Run was not called")
	}
}

func TestAcceptRoutesEachMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		msg       connector.Message
		intake    string // [intake] default_agent
		wantAgent string // "" means: acknowledged and dropped
	}{
		{"Exact_channel_id_comes_first", connector.Message{Connector: "alpha", ID: "1", Channel: "C1", ChannelName: "ops-x", Server: "S9"}, "", "ops-agent"},
		{"Then_a_channel_name_glob", connector.Message{Connector: "alpha", ID: "2", Channel: "C2", ChannelName: "ops-x", Server: "S9"}, "", "glob-agent"},
		{"Then_the_server", connector.Message{Connector: "alpha", ID: "3", Channel: "C2", ChannelName: "random", Server: "S9"}, "", "server-agent"},
		{"Then_the_connector_default_agent", connector.Message{Connector: "alpha", ID: "4", Channel: "C2", ChannelName: "random"}, "", "helper"},
		{"Then_the_intake_default_agent", connector.Message{Connector: "beta", ID: "5", Channel: "C2"}, "fallback", "fallback"},
		{"An_unroutable_message_is_acknowledged_and_dropped", connector.Message{Connector: "beta", ID: "6", Channel: "C2"}, "", ""},
		{"A_message_with_an_unusable_id_is_acknowledged_and_dropped", connector.Message{Connector: "alpha", ID: "a/b", Channel: "C1"}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := platformConfig()
			cfg.Intake.DefaultAgent = tc.intake
			f := newFakePlatforms(nil)
			s, path := startPlatforms(t, cfg, f)
			runService(t, s)
			fc := f.get(tc.msg.Connector)
			tc.msg.Author, tc.msg.Text = "ada", "hello"
			if err := fc.Deliver(context.Background(), tc.msg); err != nil {
				t.Fatalf("Accept = %v, want nil (acknowledge)", err)
			}
			m, found, err := s.store.message(tc.msg.Connector, tc.msg.ID)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantAgent == "" {
				s.Close()
				if n := countEntries(t, path)["inbox/messages"]; n != 0 || found {
					t.Fatalf("inbox holds %d messages after a dropped one, want 0", n)
				}
				return
			}
			if !found || m.Agent != tc.wantAgent || m.State != statePending {
				t.Fatalf("stored %+v (found %v), want pending for %s", m, found, tc.wantAgent)
			}
		})
	}
}

func TestRedeliveredEventIsSubmittedOnce(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	sub := newRecordingSubmitter()
	s, path := startPlatforms(t, platformConfig(), f, WithSubmitter(sub))
	runService(t, s)
	fc := f.get("alpha")
	msg := connector.Message{Connector: "alpha", ID: "ev-1", Channel: "C1", Author: "ada", Text: "once"}
	for i := range 3 {
		if err := fc.Deliver(context.Background(), msg); err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
	}
	eventually(t, "the message is submitted", func() bool {
		m, _, _ := s.store.message("alpha", "ev-1")
		return m.State == stateSubmitted
	})
	// Redelivered after it was submitted, too.
	if err := fc.Deliver(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if n := len(sub.submitted("alpha/ev-1")); n != 1 {
		t.Fatalf("Submit called %d times, want 1", n)
	}
	s.Close()
	if n := countEntries(t, path)["inbox/messages"]; n != 1 {
		t.Fatalf("inbox holds %d messages, want 1", n)
	}
}

func TestMessageWithANULFromAPlatformIsStoredMadeValid(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	sub := newRecordingSubmitter()
	s, _ := startPlatforms(t, platformConfig(), f, WithSubmitter(sub))
	runService(t, s)
	msg := connector.Message{Connector: "alpha", ID: "nul", Channel: "C1", Author: "a\xffda", Text: "hi\x00there"}
	if err := f.get("alpha").Deliver(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the message is submitted", func() bool { return len(sub.submitted("alpha/nul")) == 1 })
	got := sub.submitted("alpha/nul")[0]
	if got["text"] != "hi\uFFFDthere" || got["author"] != "a\uFFFDda" {
		t.Fatalf("submitted text %q author %q, want the bad bytes replaced by U+FFFD", got["text"], got["author"])
	}
}

func TestReplyGoesBackThroughItsConnectorWithTheMessageMeta(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	s, _ := startPlatforms(t, platformConfig(), f, WithSubmitter(newRecordingSubmitter()))
	runService(t, s)
	msg := connector.Message{Connector: "alpha", ID: "m1", Channel: "C1", Server: "S1", Thread: "T1", Author: "ada", Text: "hi", Meta: map[string]string{"dm": "false"}}
	if err := f.get("alpha").Deliver(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-1", "message_id": "alpha/m1", "connector": "alpha", "state": "succeeded", "text": "hello back"})); err != nil {
		t.Fatal(err)
	}
	r, ok := f.get("alpha").NextSend(10 * time.Second)
	if !ok {
		t.Fatal("the connector got no reply")
	}
	if r.RunID != "run-1" || r.MessageID != "m1" || r.Channel != "C1" || r.Thread != "T1" || r.Text != "hello back" || r.Failed ||
		r.Meta["dm"] != "false" || r.Meta[connector.MetaServer] != "S1" {
		t.Fatalf("reply = %+v, want run-1 for m1 in C1/T1 with the message's meta and server", r)
	}
	eventually(t, "the reply is marked delivered", func() bool {
		rs := outboxEntries(t, s)
		return len(rs) == 1 && rs[0].State == stateDelivered
	})

	// A failed run's reply says so.
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-2", "message_id": "alpha/m1", "connector": "alpha", "state": "failed", "error": "timed out after 300s"})); err != nil {
		t.Fatal(err)
	}
	r, ok = f.get("alpha").NextSend(10 * time.Second)
	if !ok || !r.Failed || !strings.Contains(r.Text, "timed out after 300s") {
		t.Fatalf("failed run's reply = %+v (%v), want Failed with the error text", r, ok)
	}
}

func TestOneDeadPlatformDoesNotDelayTheOthers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{}) // lets the hung calls end when the test does
	f := newFakePlatforms(func(id string, c *connectortest.Connector) {
		if id == "beta" { // a platform that accepts the request and never answers
			c.SendFunc = func(ctx context.Context, _ connector.Reply) error {
				select {
				case <-ctx.Done():
				case <-release:
				}
				return errors.New("no answer")
			}
		}
	})
	cfg := platformConfig()
	cfg.Intake.DefaultAgent = "helper"
	// Submits of beta's messages hang too, until their deadline.
	sub := newRecordingSubmitter("beta")
	sub.release = release
	s, _ := startPlatforms(t, cfg, f, WithSubmitter(sub))
	s.callTimeout = time.Hour // far beyond the test: only isolation can pass it
	runService(t, s)
	t.Cleanup(func() { close(release) }) // runs before runService's cleanup

	t.Run("Replies", func(t *testing.T) {
		for i := range 3 {
			id := strconv.Itoa(i)
			if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-b" + id, "message_id": "b" + id, "connector": "beta", "text": "x"})); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok := f.get("beta").NextSend(10 * time.Second); !ok {
			t.Fatal("beta's first reply was not sent")
		}
		// beta's Send now hangs; alpha's replies arrive all the same.
		for i := range 3 {
			id := strconv.Itoa(i)
			if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-a" + id, "message_id": "a" + id, "connector": "alpha", "text": "y"})); err != nil {
				t.Fatal(err)
			}
			r, ok := f.get("alpha").NextSend(10 * time.Second)
			if !ok || r.RunID != "run-a"+id {
				t.Fatalf("alpha's reply %s: got %+v (%v) while beta hangs", id, r, ok)
			}
		}
	})
	t.Run("Messages", func(t *testing.T) {
		if err := f.get("beta").Deliver(context.Background(), connector.Message{Connector: "beta", ID: "in-b", Channel: "C9", Author: "a", Text: "t"}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "beta's Submit is in flight", func() bool { return len(sub.submitted("beta/in-b")) == 1 })
		if err := f.get("alpha").Deliver(context.Background(), connector.Message{Connector: "alpha", ID: "in-a", Channel: "C9", Author: "a", Text: "t"}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "alpha's message is submitted while beta's Submit hangs", func() bool {
			m, _, _ := s.store.message("alpha", "in-a")
			return m.State == stateSubmitted
		})
	})
}

func TestReplyOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		first     error
		wantState string
		wantError string
		wantRetry time.Duration // exact wait before the second Send; 0: none
	}{
		{"Permanent_refusal_is_marked_failed_with_the_platform_reason",
			&connector.PermanentError{Reason: "channel not found"}, stateFailed, "channel not found", 0},
		{"Rate_limit_is_retried_after_the_wait_the_platform_asked_for",
			&connector.RetryAfterError{After: 7 * time.Second, Err: errors.New("429")}, stateDelivered, "", 7 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls sync.Mutex
			n := 0
			f := newFakePlatforms(func(_ string, c *connectortest.Connector) {
				c.SendFunc = func(context.Context, connector.Reply) error {
					calls.Lock()
					defer calls.Unlock()
					n++
					if n == 1 {
						return tc.first
					}
					return nil
				}
			})
			clock := clockwork.NewFakeClockAt(time.Now())
			s, _ := startPlatforms(t, platformConfig(), f, WithClock(clock))
			passes := passHook(s)
			runService(t, s)
			passes.drain()
			start := clock.Now()
			if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-1", "message_id": "m1", "connector": "alpha", "text": "hi"})); err != nil {
				t.Fatal(err)
			}
			if _, ok := f.get("alpha").NextSend(10 * time.Second); !ok {
				t.Fatal("no Send")
			}
			passes.waitFor(t, "deliver/alpha")
			r := outboxEntries(t, s)[0]
			if tc.wantRetry == 0 {
				if r.State != tc.wantState || !strings.Contains(r.LastError, tc.wantError) {
					t.Fatalf("reply = %+v, want %s with %q", r, tc.wantState, tc.wantError)
				}
				if _, outbox := s.store.pendingCounts(); outbox != 0 {
					t.Fatalf("OutboxPending = %d after a permanent failure, want 0", outbox)
				}
				return
			}
			if !r.NextAttempt.Equal(start.Add(tc.wantRetry)) {
				t.Fatalf("next attempt at +%v, want +%v", r.NextAttempt.Sub(start), tc.wantRetry)
			}
			clock.Advance(tc.wantRetry)
			if _, ok := f.get("alpha").NextSend(10 * time.Second); !ok {
				t.Fatal("no second Send after the wait")
			}
			eventually(t, "the reply is delivered", func() bool { return outboxEntries(t, s)[0].State == tc.wantState })
		})
	}
}

func TestTypingIsShownWhileARunIsInProgress(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	clock := clockwork.NewFakeClockAt(time.Now())
	s, _ := startPlatforms(t, platformConfig(), f, WithClock(clock), WithSubmitter(newRecordingSubmitter()))
	passes := passHook(s)
	runService(t, s)
	passes.waitFor(t, "typing")
	fc := f.get("alpha")
	if err := fc.Deliver(context.Background(), connector.Message{Connector: "alpha", ID: "m1", Channel: "C1", Author: "a", Text: "t"}); err != nil {
		t.Fatal(err)
	}
	waitTyping := func(what string) {
		t.Helper()
		select {
		case ch := <-fc.Typings():
			if ch != "C1" {
				t.Fatalf("typing shown in %q, want C1", ch)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no typing %s", what)
		}
	}
	waitTyping("when the message was handed to the scheduler")
	clock.Advance(typingEvery)
	waitTyping("a few seconds later, while the run goes on")
}

func TestConnectorsPropertyListsEachConnectorWithoutCredentials(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "tok-very-secret-123"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	f := newFakePlatforms(func(id string, c *connectortest.Connector) {
		c.SetStatus(connector.Status{
			Type: "fake", State: connector.StateConnected, ConnectedSince: since, LastEvent: since.Add(time.Minute),
			LastError: "gateway said 4004 for token " + token, LastErrorAt: since.Add(2 * time.Minute), Reconnects: 3, Warning: "webhook secret " + testSecret + " seen",
		})
	})
	cfg := platformConfig()
	cfg.Connectors[0].Token = tokenFile
	cfg.Connectors = append(cfg.Connectors, config.Connector{ID: "hooks", Type: "webhook", Secret: testSecret})
	s, _ := startPlatforms(t, cfg, f)
	b := exportOnPrivateBus(t, s)

	out := b.BusctlAs(t, "nobody", "--json=short", "get-property", bus.IntakeName, string(bus.IntakePath), bus.IntakeInterface, "Connectors")
	for _, secret := range []string{token, testSecret} {
		if strings.Contains(out, secret) {
			t.Fatalf("the Connectors property shows a credential:\n%s", out)
		}
	}
	v, err := intakeProxy(b.Conn(t)).GetProperty(bus.IntakeInterface + ".Connectors")
	if err != nil {
		t.Fatal(err)
	}
	list, ok := v.Value().([]map[string]dbus.Variant)
	if !ok {
		t.Fatalf("Connectors is %s, want aa{sv}", v.Signature())
	}
	if len(list) != 3 {
		t.Fatalf("Connectors lists %d connectors, want 3:\n%s", len(list), out)
	}
	alpha, hooks := list[0], list[2]
	want := map[string]any{
		"id": "alpha", "type": "fake", "state": "connected", "connected_since": "2026-12-01T09:00:00Z",
		"last_event": "2026-12-01T09:01:00Z", "last_error": "gateway said 4004 for token [redacted]", "last_error_at": "2026-12-01T09:02:00Z", "reconnects": uint32(3),
		"warning": "webhook secret [redacted] seen",
	}
	for k, w := range want {
		if got := alpha[k].Value(); got != w {
			t.Errorf("alpha %s = %#v, want %#v", k, got, w)
		}
	}
	if hooks["id"].Value() != "hooks" || hooks["type"].Value() != "webhook" || hooks["state"].Value() != connector.StateHTTP {
		t.Errorf("hooks = %v, want the webhook connector in state http", hooks)
	}
}

func TestHTTPReceiverIsServedAtItsConnectorPath(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(func(id string, c *connectortest.Connector) {
		c.Receiver = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusTeapot)
			_, _ = w.Write([]byte(id + " " + r.Method + " " + r.URL.Path))
		})
	})
	s, _ := startPlatforms(t, platformConfig(), f)
	tests := []struct {
		name, method, path string
		wantStatus         int
		wantBody           string
	}{
		{"A_POST_reaches_the_connector", http.MethodPost, "/hooks/alpha", http.StatusTeapot, "alpha POST /hooks/alpha"},
		{"A_GET_reaches_it_too", http.MethodGet, "/hooks/beta", http.StatusTeapot, "beta GET /hooks/beta"},
		{"So_does_a_sub_path", http.MethodPost, "/hooks/alpha/events", http.StatusTeapot, "alpha POST /hooks/alpha/events"},
		{"An_unknown_connector_is_not_found", http.MethodPost, "/hooks/gamma", http.StatusNotFound, "no webhook connector"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
			if w.Code != tc.wantStatus || !strings.Contains(w.Body.String(), tc.wantBody) {
				t.Fatalf("%s %s = %d %q, want %d %q", tc.method, tc.path, w.Code, w.Body, tc.wantStatus, tc.wantBody)
			}
		})
	}
}

func TestReloadRebuildsOnlyTheConnectorsThatChanged(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	s, _ := startPlatforms(t, platformConfig(), f)
	runService(t, s)
	oldAlpha, oldBeta := f.get("alpha"), f.get("beta")
	waitRunning(t, oldAlpha)
	waitRunning(t, oldBeta)

	cfg := platformConfig()
	cfg.Connectors[1].DefaultAgent = "changed"
	cfg.Connectors = append(cfg.Connectors, config.Connector{ID: "gamma", Type: "fake"})
	s.Reload(cfg)
	select {
	case <-oldBeta.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the changed connector's old Run was not stopped")
	}
	waitRunning(t, f.get("beta"))
	waitRunning(t, f.get("gamma"))
	if f.buildsOf("alpha") != 1 || f.buildsOf("beta") != 2 || f.buildsOf("gamma") != 1 {
		t.Fatalf("builds alpha=%d beta=%d gamma=%d, want 1, 2, 1", f.buildsOf("alpha"), f.buildsOf("beta"), f.buildsOf("gamma"))
	}

	s.Reload(&config.Config{Connectors: cfg.Connectors[1:]})
	select {
	case <-oldAlpha.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the removed connector's Run was not stopped")
	}
}

func TestIdleExitIsOffOnlyWhileALongLivedConnectorIsConfigured(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		connectors []config.Connector
		long       bool // what the fake connectors say
		want       bool
	}{
		{"Webhooks_only_may_exit", []config.Connector{{ID: "h", Type: "webhook"}}, false, false},
		{"An_HTTP_only_connector_may_exit", []config.Connector{{ID: "f", Type: "fake"}}, false, false},
		{"A_connection_held_open_keeps_intake_up", []config.Connector{{ID: "h", Type: "webhook"}, {ID: "f", Type: "fake"}}, true, true},
		{"A_MeepaChat_gateway_that_cannot_be_built_still_counts", []config.Connector{{ID: "m", Type: config.ConnectorMeepaChat}}, false, true},
		{"Slack_over_the_Events_API_may_exit", []config.Connector{{ID: "s", Type: config.ConnectorSlack, Mode: config.SlackEvents}}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakePlatforms(func(_ string, c *connectortest.Connector) { c.Long = tc.long })
			s, _ := startPlatforms(t, &config.Config{Connectors: tc.connectors}, f)
			if got := s.HasLongLivedConnector(); got != tc.want {
				t.Fatalf("HasLongLivedConnector = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestConnectorsPropertyFollowsStateChangesAndReloads(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	clock := clockwork.NewFakeClockAt(time.Now())
	s, _ := startPlatforms(t, platformConfig(), f, WithClock(clock))
	b := exportOnPrivateBus(t, s)
	runService(t, s)
	client := b.Conn(t)
	property := func() map[string]map[string]dbus.Variant {
		v, err := intakeProxy(client).GetProperty(bus.IntakeInterface + ".Connectors")
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]map[string]dbus.Variant{}
		for _, c := range v.Value().([]map[string]dbus.Variant) {
			byID[c["id"].Value().(string)] = c
		}
		return byID
	}
	f.get("alpha").SetStatus(connector.Status{Type: "fake", State: connector.StateDisconnected, LastError: "connection reset", Reconnects: 4})
	eventually(t, "the property shows alpha disconnected", func() bool {
		clock.Advance(time.Second) // the deliver loop publishes at least every 5 s
		c := property()["alpha"]
		return c["state"].Value() == connector.StateDisconnected && c["reconnects"].Value() == uint32(4) && c["last_error"].Value() == "connection reset"
	})
	cfg := platformConfig()
	cfg.Connectors = append(cfg.Connectors, config.Connector{ID: "gamma", Type: "fake"})
	s.Reload(cfg)
	eventually(t, "the property lists the connector added by the reload", func() bool { _, ok := property()["gamma"]; return ok })
}

func TestAConnectorWhoseRunFailsIsRestartedWithBackOff(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(func(id string, c *connectortest.Connector) {
		if id == "alpha" {
			c.FailRuns = 3
		}
	})
	clock := clockwork.NewFakeClockAt(time.Now())
	s, _ := startPlatforms(t, platformConfig(), f, WithClock(clock))
	runService(t, s)
	fc := f.get("alpha")
	eventually(t, "alpha's Run is restarted until it holds", func() bool {
		select {
		case <-fc.Running():
			return true
		default:
			clock.Advance(50 * time.Millisecond) // the test's back-off is 10-100ms
			return false
		}
	})
	if n := fc.FailedRuns(); n != 3 {
		t.Fatalf("Run failed %d times before it held, want 3", n)
	}
}
