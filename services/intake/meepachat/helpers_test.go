package meepachat

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
)

const (
	testBotID  = "bot-7f3a"
	testSecret = "s3cr3t-Zq9xWv"
	testToken  = testBotID + "." + testSecret
	serverID   = "srv-1"
	channelID  = "ch-general"
	dmID       = "dm-alice"
)

func strp(s string) *string { return &s }

// testOptions is a fake with one server (two channels) and one DM.
func testOptions() meepachattest.Options {
	return meepachattest.Options{
		Token: testToken,
		Bot:   meepachattest.User{ID: testBotID, Username: "berth", DisplayName: "Berth", Bot: true},
		Servers: []meepachattest.Server{{ID: serverID, Name: "Home", Channels: []meepachattest.Channel{
			{ID: channelID, ServerID: strp(serverID), Name: "general"},
			{ID: "ch-random", ServerID: strp(serverID), Name: "random"},
		}}},
		DMChannels: []meepachattest.Channel{{ID: dmID, IsDM: true}},
	}
}

func newFake(t *testing.T, o meepachattest.Options) *meepachattest.Fake {
	t.Helper()
	f := meepachattest.New(o)
	t.Cleanup(f.Close)
	return f
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newTestConnector connects to f with fast back-off and a captured debug log.
func newTestConnector(t *testing.T, f *meepachattest.Fake, edit func(*Options)) (*Connector, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	o := Options{
		BaseURL: f.URL, Token: testToken, Trigger: TriggerAll, // most tests hear every message
		// Carrying connector= as intake's logger for a connector does.
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("connector", "chat"),
		BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
	}
	if edit != nil {
		edit(&o)
	}
	c, err := New("chat", o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, logs
}

// start runs c until the test ends.
func start(t *testing.T, c *Connector, sink connector.Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v, want nil when its context ends", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
		if st := c.Status().State; st != connector.StateStopped {
			t.Errorf("state after Run returned = %q, want %q", st, connector.StateStopped)
		}
	})
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitStatus waits until cond holds for c's status.
func waitStatus(ctx context.Context, t *testing.T, c *Connector, what string, cond func(connector.Status) bool) connector.Status {
	t.Helper()
	for {
		st, ch := c.status.Watch()
		if cond(st) {
			return st
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s; status %+v", what, st)
		}
	}
}

// recordingSink records what it accepts; fail decides per call whether to
// refuse.
type recordingSink struct {
	mu       sync.Mutex
	got      []connector.Message
	calls    int
	inFlight int
	overlap  bool
	fail     func(call int, m connector.Message) error
	changed  chan struct{}
}

func newSink() *recordingSink { return &recordingSink{changed: make(chan struct{})} }

func (s *recordingSink) Accept(ctx context.Context, m connector.Message) error {
	s.mu.Lock()
	s.calls++
	call := s.calls
	s.inFlight++
	if s.inFlight > 1 {
		s.overlap = true
	}
	fail := s.fail
	s.mu.Unlock()
	var err error
	if fail != nil {
		err = fail(call, m)
	}
	s.mu.Lock()
	s.inFlight--
	if err == nil {
		s.got = append(s.got, m)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return err
}

// wait returns the accepted messages once there are n.
func (s *recordingSink) wait(ctx context.Context, t *testing.T, n int) []connector.Message {
	t.Helper()
	for {
		s.mu.Lock()
		got, ch := append([]connector.Message(nil), s.got...), s.changed
		s.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %d accepted messages; have %d: %+v", n, len(got), got)
		}
	}
}

func ids(ms []connector.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

var errDiskFull = errors.New("intake.db: no space left on device")

// human is a message from a person in the general channel.
func human(id, text string) meepachattest.Message {
	return meepachattest.Message{
		ID: id, ChannelID: channelID, UserID: "u-alice", Content: text,
		User: &meepachattest.User{ID: "u-alice", Username: "alice"},
	}
}

// connected starts c on f and waits until the gateway subscribed it.
func connected(ctx context.Context, t *testing.T, f *meepachattest.Fake, c *Connector, sink connector.Sink) {
	t.Helper()
	start(t, c, sink)
	if err := f.WaitConnections(ctx, 1, channelID, "ch-random", dmID); err != nil {
		t.Fatal(err)
	}
	waitStatus(ctx, t, c, "connected", func(s connector.Status) bool { return s.State == connector.StateConnected })
}

func deliver(ctx context.Context, t *testing.T, f *meepachattest.Fake, m meepachattest.Message) {
	t.Helper()
	n, err := f.Deliver(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("message %s reached no subscribed connection", m.ID)
	}
}

// holdingHandler is a log handler that holds the goroutine logging a record
// whose message is held until release is closed, to stretch the moment
// between two steps of the connector as a loaded machine would.
type holdingHandler struct {
	held    string
	reached chan struct{} // closed when the held record is first logged
	release chan struct{}
	once    *sync.Once
}

func newHoldingHandler(msg string) *holdingHandler {
	return &holdingHandler{held: msg, reached: make(chan struct{}), release: make(chan struct{}), once: &sync.Once{}}
}

func (h *holdingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *holdingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.held {
		h.once.Do(func() { close(h.reached) })
		<-h.release
	}
	return nil
}

func (h *holdingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *holdingHandler) WithGroup(string) slog.Handler      { return h }

// lateTickerClock is a fake clock whose first NewTicker returns only once
// release is closed, as a watcher goroutine scheduled late would.
type lateTickerClock struct {
	*clockwork.FakeClock
	release chan struct{}
	once    *sync.Once
}

func newLateTickerClock() *lateTickerClock {
	return &lateTickerClock{FakeClock: clockwork.NewFakeClock(), release: make(chan struct{}), once: &sync.Once{}}
}

func (c *lateTickerClock) NewTicker(d time.Duration) clockwork.Ticker {
	t := c.FakeClock.NewTicker(d)
	c.once.Do(func() { <-c.release })
	return t
}
