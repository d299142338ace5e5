package slack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

const testTimeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// recordingSink records every Accept call, including failed ones; accept,
// when set, decides the outcome (and may block).
type recordingSink struct {
	accept func(m connector.Message) error

	mu      sync.Mutex
	calls   []connector.Message
	changed chan struct{}
}

func newSink() *recordingSink { return &recordingSink{changed: make(chan struct{})} }

func (s *recordingSink) Accept(_ context.Context, m connector.Message) error {
	var err error
	if s.accept != nil {
		err = s.accept(m)
	}
	s.mu.Lock()
	s.calls = append(s.calls, m)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return err
}

func (s *recordingSink) Calls() []connector.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]connector.Message(nil), s.calls...)
}

// wait returns the calls once there are at least n.
func (s *recordingSink) wait(ctx context.Context, t *testing.T, n int) []connector.Message {
	t.Helper()
	for {
		s.mu.Lock()
		calls, ch := append([]connector.Message(nil), s.calls...), s.changed
		s.mu.Unlock()
		if len(calls) >= n {
			return calls
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d messages at the sink, got %d: %+v", n, len(calls), calls)
		case <-ch:
		}
	}
}

// logBuffer captures the connector's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	t.Helper()
	buf := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("connector log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// socketOptions are Options for a socket-mode connector on fake.
func socketOptions(t *testing.T, fake *slacktest.Server) (Options, *logBuffer) {
	t.Helper()
	log, buf := testLogger(t)
	fo := fake.Options()
	return Options{
		BaseURL:    fake.APIURL(),
		AppToken:   fo.AppToken,
		BotToken:   fo.BotToken,
		Logger:     log,
		BackoffMin: 5 * time.Millisecond,
		BackoffMax: 50 * time.Millisecond,
	}, buf
}

// run starts c.Run until the test ends.
func run(t *testing.T, c *Connector, sink connector.Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v, want nil after its context ended", err)
			}
		case <-time.After(testTimeout):
			t.Errorf("Run did not return after its context ended")
		}
	})
}

// startSocket runs a socket-mode connector on fake, changed by edit.
func startSocket(t *testing.T, fake *slacktest.Server, sink connector.Sink, edit func(*Options)) (*Connector, *logBuffer) {
	t.Helper()
	o, buf := socketOptions(t, fake)
	if edit != nil {
		edit(&o)
	}
	c, err := New("slack-test", o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	run(t, c, sink)
	if err := fake.WaitConnections(testContext(t), 1); err != nil {
		t.Fatal(err)
	}
	return c, buf
}

var tsSeq struct {
	sync.Mutex
	n int
}

// newTS returns a fresh Slack message ts.
func newTS() string {
	tsSeq.Lock()
	defer tsSeq.Unlock()
	tsSeq.n++
	return fmt.Sprintf("1767326125.%06d", tsSeq.n)
}

// mention is a channel message that mentions the fake's bot.
func mention(fake *slacktest.Server, text string) slacktest.Event {
	return slacktest.Event{
		Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE",
		Text: "<@" + fake.Options().BotUserID + "> " + text, TS: newTS(),
	}
}
