package discord_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// recordingSink stores accepted messages in memory; failNext makes the next
// Accepts fail as a full disk would.
type recordingSink struct {
	mu       sync.Mutex
	changed  chan struct{}
	msgs     []connector.Message
	calls    []string // message ids, every Accept call
	failNext int
}

func newSink() *recordingSink { return &recordingSink{changed: make(chan struct{})} }

func (s *recordingSink) Accept(_ context.Context, m connector.Message) error {
	s.mu.Lock()
	defer func() {
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}()
	s.calls = append(s.calls, m.ID)
	if s.failNext > 0 {
		s.failNext--
		return errors.New("cannot store the message: no space left on device")
	}
	s.msgs = append(s.msgs, m)
	return nil
}

func (s *recordingSink) failing(n int) { s.mu.Lock(); s.failNext = n; s.mu.Unlock() }

func (s *recordingSink) messages() []connector.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

func (s *recordingSink) acceptCalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// wait waits until n messages were accepted.
func (s *recordingSink) wait(t *testing.T, n int) []connector.Message {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		s.mu.Lock()
		got, ch := len(s.msgs), s.changed
		s.mu.Unlock()
		if got >= n {
			return s.messages()
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %d accepted messages; have %d", n, got)
		}
	}
}

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newConnector builds a connector against fake with fast back-off and a
// debug log captured in the returned buffer.
func newConnector(t *testing.T, fake *discordtest.Server, mutate func(*discord.Options)) (*discord.Connector, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	o := discord.Options{
		BaseURL:       fake.URL,
		BotToken:      fake.Token,
		ApplicationID: fake.AppID,
		PublicKey:     hexKey(fake),
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("connector", "discord-main"),
		BackoffMin:    5 * time.Millisecond,
		BackoffMax:    20 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&o)
	}
	c, err := discord.New("discord-main", o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, logs
}

// run runs c until the test ends and checks Run returns nil then.
func run(t *testing.T, c *discord.Connector, sink connector.Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after its context ended, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
	})
}

// eventually polls cond (a state the connector reaches by itself, with no
// event to wait on) until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connected waits for the first handshake and for the connector to have
// read its READY (the session a RESUME needs).
func connected(t *testing.T, fake *discordtest.Server, c *discord.Connector) {
	t.Helper()
	fake.WaitHandshakes(t, 1)
	eventually(t, "the connector to read READY", func() bool { return c.Status().State == connector.StateConnected })
}

var (
	alice  = discordtest.User{ID: "500000000000000001", Username: "alice"}
	robot  = discordtest.User{ID: "500000000000000002", Username: "otherbot", Bot: true}
	guild  = "600000000000000001"
	other  = "600000000000000002"
	chanID = "700000000000000001"
	dmID   = "700000000000000009"
)
