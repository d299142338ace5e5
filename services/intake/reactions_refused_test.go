package intake

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// statusOf is connector id's entry of ConnectorStatuses.
func statusOf(t *testing.T, s *Service, id string) ConnectorStatus {
	t.Helper()
	for _, c := range s.ConnectorStatuses() {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("no connector %q in %+v", id, s.ConnectorStatuses())
	return ConnectorStatus{}
}

// A Slack app installed without reactions:write: the first reaction is
// refused with missing_scope, the connector's status says what to grant,
// and intake asks no more (the scope holds for every channel) while replies
// go on.
func TestReactionsRefusedForAMissingSlackScopeShowInTheStatusAndStop(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	fake.WithoutReactionsScope()
	clock := clockwork.NewFakeClock()
	fake.SetClock(clock.Now)
	cfg := slackConfig(t, fake, t.TempDir())
	cfg.Connectors[0].Progress, cfg.Connectors[0].Reactions = "typing", true
	sub := newCountingSubmitter()
	s, err := New(cfg, t.TempDir(), WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithRetryDelays(10*time.Millisecond, 100*time.Millisecond), WithSubmitter(sub), WithClock(clock))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	runService(t, s)

	if got := statusOf(t, s, "sl"); got.Reactions != "on" || got.Progress != "typing" {
		t.Fatalf("before any reaction: progress %q, reactions %q; want typing, on", got.Progress, got.Reactions)
	}
	const ts = "1700000000.000200"
	msgID := "C0CHAN:" + ts
	if err := s.Accept(context.Background(), connector.Message{Connector: "sl", ID: msgID, Channel: "C0CHAN", Thread: ts, Author: "U0ALICE", Text: "hello"}); err != nil {
		t.Fatalf("Accept: %v", err)
	}
	eventually(t, "👀 is refused", func() bool { return fake.RefusedReactions() == 1 })
	eventually(t, "the status names the scope", func() bool {
		return strings.Contains(statusOf(t, s, "sl").Reactions, "reactions:write")
	})
	if got := statusOf(t, s, "sl").Reactions; !strings.HasPrefix(got, "refused, none added until intake restarts") {
		t.Fatalf("reactions = %q, want a refusal for every channel", got)
	}

	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: msgID, Connector: "sl", State: "succeeded", Text: "hi"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	// markDelivered comes after the ✅ would have been started, so once the
	// outbox is empty every reaction intake meant to add is under way;
	// reacting.Wait lets them end.
	eventually(t, "the reply is delivered", func() bool { _, out := s.store.pendingCounts(); return out == 0 && len(fake.Posts()) == 1 })
	s.progress.reacting.Wait()
	if n := fake.RefusedReactions(); n != 1 {
		t.Fatalf("reactions.add was called %d times, want 1: a scope missing everywhere is not asked again", n)
	}
}

// Discord permissions are per channel: a 403 in one channel shows in the
// status, and a message in another channel still gets its reaction.
func TestReactionsRefusedInOneDiscordChannelShowInTheStatusAndOthersStillGetThem(t *testing.T) {
	t.Parallel()
	fake, d, s, _ := progressDiscord(t, "off", true)
	_ = d
	eventually(t, "👀 on the first message", func() bool { return len(fake.Reactions()) == 1 })
	if got := statusOf(t, s, "dc").Reactions; got != "on" {
		t.Fatalf("reactions = %q, want on", got)
	}
	const denied = "700000000000000002"
	fake.DenyReactions(denied)
	fake.GuildCreate(progressGuild, discordtest.Channel{ID: denied, Name: "locked"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1001", Channel: denied, Guild: progressGuild,
		Author: discordtest.User{ID: "500000000000000001", Username: "alice"}, Content: "and here?"})
	eventually(t, "👀 in the locked channel is refused", func() bool { return fake.RefusedReactions() == 1 })
	eventually(t, "the status says so", func() bool {
		return strings.HasPrefix(statusOf(t, s, "dc").Reactions, "refused in a channel: ") &&
			strings.Contains(statusOf(t, s, "dc").Reactions, "Add Reactions")
	})

	fake.MessageCreate(discordtest.MessageSpec{ID: "1002", Channel: progressChannel, Guild: progressGuild,
		Author: discordtest.User{ID: "500000000000000001", Username: "alice"}, Content: "and back here"})
	eventually(t, "👀 on the third message, in the open channel", func() bool { return len(fake.Reactions()) == 2 })
}
