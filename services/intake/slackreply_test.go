package intake

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// slackConfig has one Slack connector "sl" (events mode) on fake, its
// credentials in files of dir.
func slackConfig(t *testing.T, fake *slacktest.Server, dir string) *config.Config {
	t.Helper()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return &config.Config{Connectors: []config.Connector{{
		ID: "sl", Type: config.ConnectorSlack, Mode: config.SlackEvents, BaseURL: fake.APIURL(), TLSVerify: true,
		BotToken:      write("bot-token", fake.Options().BotToken),
		SigningSecret: write("signing-secret", "slack-signing-secret-for-tests"),
		DefaultAgent:  "helper", Trigger: config.TriggerMention,
	}}}
}

func TestASlackReplyPostedJustBeforeACrashIsNotPostedAgainAfterTheRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fake := slacktest.New(t, slacktest.Options{})
	question := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "<@U0BOT> hi", TS: "1767326125.000100"}
	fake.Callback(question) // in the channel's history
	stateDir := t.TempDir()
	cfg := slackConfig(t, fake, t.TempDir())
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	open := func() *Service {
		s, err := New(cfg, stateDir, WithLogger(logger), WithRetryDelays(10*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	}

	// The first intake posts the reply and dies before it marks it
	// delivered: its database is gone while Slack's answer is held.
	first := open()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- first.Run(runCtx) }()
	release := fake.HoldPosts()
	reply := map[string]string{"run_id": "run-9", "message_id": "sl/C0CHAN:" + question.TS, "connector": "sl",
		"channel": "C0CHAN", "thread": question.TS, "state": "succeeded", "text": "hello back"}
	if err := first.Deliver(busapi.ReplyFromWire(reply)); err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitHeldPost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	release()
	stop()
	<-done

	second := open()
	t.Cleanup(func() { _ = second.Close() })
	runService(t, second)
	eventually(t, "the reply is delivered after the restart", func() bool {
		r := outboxEntries(t, second)
		return len(r) == 1 && r[0].State == stateDelivered
	})
	posts := fake.Posts()
	if len(posts) != 1 {
		t.Fatalf("Slack got %d posts of the reply, want 1: %+v", len(posts), posts)
	}
	if !strings.Contains(posts[0].Text, "hello back") || posts[0].ThreadTS != question.TS {
		t.Errorf("post = %+v, want the reply in the thread", posts[0])
	}
	if fake.HistoryReads() == 0 {
		t.Error("the retry after the restart did not look at the thread")
	}
}

func TestSlackAndMeepaChatLogLinesNameTheirConnectorOnce(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	credentials := t.TempDir()
	cfg := slackConfig(t, fake, credentials)
	meepa := meepachattest.New(meepachattest.Options{
		Token: "bot-1.s3cret",
		Bot:   meepachattest.User{ID: "bot-1", Username: "berth", Bot: true},
	})
	t.Cleanup(meepa.Close)
	tokenFile := filepath.Join(credentials, "meepa-token")
	if err := os.WriteFile(tokenFile, []byte("bot-1.s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Connectors = append(cfg.Connectors, config.Connector{
		ID: "mc", Type: config.ConnectorMeepaChat, BaseURL: meepa.URL, Token: tokenFile, TLSVerify: true,
		DefaultAgent: "helper", Trigger: config.TriggerMention,
	})
	var logs syncBuffer
	s, _ := newTestService(t, cfg, WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	runService(t, s)

	// A log line of each: MeepaChat's gateway is ready, Slack refuses an
	// unsigned Events API request.
	eventually(t, "the MeepaChat gateway is ready", func() bool { return strings.Contains(logs.String(), "meepachat gateway ready") })
	req, err := http.NewRequest(http.MethodPost, "/hooks/sl", strings.NewReader(`{"type":"event_callback"}`))
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, req)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("unsigned Slack request answered %d, want 401", w.Code)
	}
	seen := map[string]bool{}
	for line := range strings.Lines(logs.String()) {
		for _, id := range []string{"sl", "mc"} {
			n := strings.Count(line, "connector="+id+" ")
			if n > 1 {
				t.Errorf("a log line names connector %s %d times: %s", id, n, line)
			}
			if n > 0 && (strings.Contains(line, "meepachat gateway ready") || strings.Contains(line, "rejected a Slack request")) {
				seen[id] = true
			}
		}
	}
	if !seen["sl"] || !seen["mc"] {
		t.Errorf("the connectors' own lines do not name them (seen %v):\n%s", seen, logs.String())
	}
}
