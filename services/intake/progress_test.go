package intake

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

const (
	progressGuild   = "600000000000000001"
	progressChannel = "700000000000000001"
)

// startOnClock is discordIntake.start on a fake clock.
func (d *discordIntake) startOnClock(clock clockwork.Clock) *Service {
	d.t.Helper()
	s, err := New(d.cfg, d.dir,
		WithLogger(slog.New(slog.NewTextHandler(testWriter{d.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithRetryDelays(10*time.Millisecond, 100*time.Millisecond),
		WithSubmitter(d.sub), WithClock(clock))
	if err != nil {
		d.t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.svc, d.cancel, d.done = s, cancel, make(chan struct{})
	go func() { defer close(d.done); _ = s.Run(ctx) }()
	d.t.Cleanup(d.stop)
	return s
}

// progressDiscord is a Discord intake with progress and reactions as given,
// its first message (id 1000) handed to the scheduler.
func progressDiscord(t *testing.T, progress string, reactions bool) (*discordtest.Server, *discordIntake, *Service, *clockwork.FakeClock) {
	t.Helper()
	fake := discordtest.New(t)
	clock := clockwork.NewFakeClock()
	fake.SetClock(clock.Now)
	d := newDiscordIntake(t, fake)
	d.cfg.Connectors[0].Progress, d.cfg.Connectors[0].Reactions = progress, reactions
	s := d.startOnClock(clock)
	fake.WaitHandshakes(t, 1)
	fake.GuildCreate(progressGuild, discordtest.Channel{ID: progressChannel, Name: "general"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1000", Channel: progressChannel, Guild: progressGuild,
		Author: discordtest.User{ID: "500000000000000001", Username: "alice"}, Content: "run the tests"})
	eventually(t, "message 1000 is submitted", func() bool { return d.sub.callsFor("dc/1000") == 1 })
	if progress == config.ProgressEdit {
		// startProgress runs once Submit has returned; a RunProgress before
		// it finds no entry (and is dropped, as for an unknown run).
		eventually(t, "message 1000's progress is kept", func() bool {
			s.progress.mu.Lock()
			defer s.progress.mu.Unlock()
			_, ok := s.progress.entries["dc/1000"]
			return ok
		})
	}
	return fake, d, s, clock
}

// advanceUntil advances clock a tenth of a second at a time until cond holds.
func advanceUntil(t *testing.T, clock *clockwork.FakeClock, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		clock.Advance(100 * time.Millisecond)
		time.Sleep(5 * time.Millisecond)
	}
}

func progress(seq uint32, text string) busapi.RunProgress {
	return busapi.RunProgress{RunID: "run-1", MessageKey: "dc/1000", Seq: seq, Text: text}
}

func TestDiscordProgress_is_one_message_edited_within_limits_then_replaced_by_the_answer(t *testing.T) {
	t.Parallel()
	fake, _, s, clock := progressDiscord(t, config.ProgressEdit, true)
	fake.WaitFor(t, "👀 on the message", func() bool {
		r := fake.Reactions()
		return len(r) == 1 && r[0] == discordtest.Reaction{Channel: progressChannel, Message: "1000", Emoji: "👀"}
	})

	s.onRunProgress(progress(1, "running `pytest`"))
	posts := fake.WaitPosts(t, 1)
	if posts[0].Content != "running `pytest`" || posts[0].Channel != progressChannel {
		t.Fatalf("progress post = %+v", posts[0])
	}
	postedAt := clock.Now()
	progressID := "900000000000000001"

	// Three more while the first edit may not be made yet: the latest wins,
	// and an older seq or another run's progress changes nothing.
	s.onRunProgress(progress(2, "fetching pypi.org"))
	s.onRunProgress(progress(3, "running `go test`"))
	s.onRunProgress(progress(2, "an older event"))
	s.onRunProgress(busapi.RunProgress{RunID: "run-9", MessageKey: "dc/1000", Seq: 9, Text: "another run's"})
	advanceUntil(t, clock, "the first edit", func() bool { return len(fake.Edits()) >= 1 })
	edits := fake.Edits()
	if len(edits) != 1 || edits[0].Message != progressID || edits[0].Content != "running `go test`" {
		t.Fatalf("edits = %+v, want one edit of %s to the latest text", edits, progressID)
	}
	if gap := edits[0].At.Sub(postedAt); gap < time.Second {
		t.Fatalf("the edit came %s after the post (fake clock), want at least 1s", gap)
	}

	// A text longer than Discord takes is cut to its limit.
	s.onRunProgress(progress(4, strings.Repeat("€", 2500)))
	advanceUntil(t, clock, "the second edit", func() bool { return len(fake.Edits()) >= 2 })
	if got := fake.Edits()[1].Content; utf8.RuneCountInString(got) > 2000 || len(got) > 2000 || !utf8.ValidString(got) {
		t.Fatalf("the long edit is %d bytes, %d characters; want at most 2,000 bytes of valid UTF-8", len(got), utf8.RuneCountInString(got))
	}

	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "succeeded", Text: "all 12 tests pass"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	advanceUntil(t, clock, "the answer, the progress message deleted, ✅", func() bool {
		return len(fake.Posts()) == 2 && fake.Deleted(progressID) && len(fake.Reactions()) == 2
	})
	if p := fake.Posts()[1]; p.Content != "all 12 tests pass" || p.ReplyTo != "1000" {
		t.Fatalf("answer = %+v", p)
	}
	if r := fake.Reactions()[1]; r.Emoji != "✅" || r.Message != "1000" {
		t.Fatalf("second reaction = %+v, want ✅ on 1000", r)
	}
	if n := fake.Overruns(); n != 0 {
		t.Fatalf("%d calls met Discord's per-channel limit", n)
	}
	// After the reply nothing more is shown.
	s.onRunProgress(progress(5, "too late"))
	if edits := fake.Edits(); len(edits) != 3 || !edits[2].Deleted {
		t.Fatalf("edits = %+v, want two edits and the delete", edits)
	}
}

func TestDiscordProgress_after_an_intake_restart_nothing_is_lost_or_doubled(t *testing.T) {
	t.Parallel()
	fake, d, s, _ := progressDiscord(t, config.ProgressEdit, false)
	s.onRunProgress(progress(1, "running `make`"))
	fake.WaitPosts(t, 1)
	eventually(t, "the progress message is kept with the message", func() bool {
		m, found, err := s.store.message("dc", "1000")
		return err == nil && found && m.ProgressMessage == "900000000000000001"
	})
	d.stop()

	s = d.startOnClock(clockwork.NewFakeClock())
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "failed", Error: "timeout"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	fake.WaitFor(t, "the answer and the progress message deleted", func() bool {
		return len(fake.Posts()) == 2 && fake.Deleted("900000000000000001")
	})
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "failed", Error: "timeout"}); err != nil {
		t.Fatalf("Deliver again: %v", err)
	}
	eventually(t, "the reply is delivered", func() bool { _, outbox := s.store.pendingCounts(); return outbox == 0 })
	posts := fake.Posts()
	if len(posts) != 2 || !strings.Contains(posts[1].Content, "timeout") {
		t.Fatalf("posts = %+v, want the progress message and one answer", posts)
	}
}

func TestDiscordProgress_off_shows_neither_typing_nor_a_progress_message(t *testing.T) {
	t.Parallel()
	fake, _, s, _ := progressDiscord(t, config.ProgressOff, false)
	s.onRunProgress(progress(1, "running `pytest`"))
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "succeeded", Text: "done"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	posts := fake.WaitPosts(t, 1)
	if len(posts) != 1 || posts[0].Content != "done" {
		t.Fatalf("posts = %+v, want the answer alone", posts)
	}
	if typing, edits, reactions := fake.Typing(), fake.Edits(), fake.Reactions(); len(typing) != 0 || len(edits) != 0 || len(reactions) != 0 {
		t.Fatalf("typing %v, edits %v, reactions %v; want none with progress off and reactions off", typing, edits, reactions)
	}
}

func TestDiscordProgress_typing_shows_typing_and_no_message(t *testing.T) {
	t.Parallel()
	fake, _, s, _ := progressDiscord(t, config.ProgressTyping, false)
	fake.WaitFor(t, "typing", func() bool { return len(fake.Typing()) >= 1 })
	s.onRunProgress(progress(1, "running `pytest`")) // typing mode keeps no progress message
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: "1000", Connector: "dc", State: "succeeded", Text: "done"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if posts := fake.WaitPosts(t, 1); len(posts) != 1 || posts[0].Content != "done" {
		t.Fatalf("posts = %+v, want the answer alone", posts)
	}
}

func TestSlackProgress_uses_chat_update_and_chat_delete_and_reactions(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	clock := clockwork.NewFakeClock()
	fake.SetClock(clock.Now)
	dir := t.TempDir()
	cfg := slackConfig(t, fake, t.TempDir())
	cfg.Connectors[0].Progress, cfg.Connectors[0].Reactions = config.ProgressEdit, true
	sub := newCountingSubmitter()
	s, err := New(cfg, dir, WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithRetryDelays(10*time.Millisecond, 100*time.Millisecond), WithSubmitter(sub), WithClock(clock))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	runService(t, s)

	const ts = "1700000000.000100"
	msgID := "C0CHAN:" + ts
	if err := s.Accept(context.Background(), connector.Message{Connector: "sl", ID: msgID, Channel: "C0CHAN", Thread: ts, Author: "U0ALICE", Text: "run the tests"}); err != nil {
		t.Fatalf("Accept: %v", err)
	}
	key := busapi.MessageKey("sl", msgID)
	eventually(t, "the message is submitted", func() bool { return sub.callsFor(key) == 1 })
	eventually(t, "👀", func() bool { return len(fake.Reactions()) == 1 })
	eventually(t, "the message's progress is kept", func() bool {
		s.progress.mu.Lock()
		defer s.progress.mu.Unlock()
		_, ok := s.progress.entries[key]
		return ok
	})

	s.onRunProgress(busapi.RunProgress{RunID: "run-1", MessageKey: key, Seq: 1, Text: "running `pytest`"})
	eventually(t, "the progress post", func() bool { return len(fake.Posts()) == 1 })
	progress := fake.Posts()[0]
	if progress.Text != "running `pytest`" || progress.ThreadTS != ts {
		t.Fatalf("progress post = %+v, want it in the thread", progress)
	}
	s.onRunProgress(busapi.RunProgress{RunID: "run-1", MessageKey: key, Seq: 2, Text: "fetching pypi.org"})
	advanceUntil(t, clock, "chat.update", func() bool { return len(fake.Edits()) == 1 })
	if e := fake.Edits()[0]; e.TS != progress.TS || e.Text != "fetching pypi.org" {
		t.Fatalf("chat.update = %+v, want the progress message %s to read the latest", e, progress.TS)
	}
	if err := s.Deliver(busapi.Reply{RunID: "run-1", MessageID: msgID, Connector: "sl", State: "succeeded", Text: "12 passed"}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	advanceUntil(t, clock, "the answer, chat.delete and ✅", func() bool {
		return len(fake.Posts()) == 2 && len(fake.Edits()) == 2 && len(fake.Reactions()) == 2
	})
	if p := fake.Posts()[1]; p.Text != "12 passed" || p.ThreadTS != ts {
		t.Fatalf("answer = %+v", p)
	}
	if e := fake.Edits()[1]; !e.Deleted || e.TS != progress.TS {
		t.Fatalf("second edit = %+v, want the delete of %s", e, progress.TS)
	}
	want := []slacktest.Reaction{{Channel: "C0CHAN", Timestamp: ts, Name: "eyes"}, {Channel: "C0CHAN", Timestamp: ts, Name: "white_check_mark"}}
	if got := fake.Reactions(); got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("reactions = %+v, want %+v", got, want)
	}
	if n := fake.Overruns(); n != 0 {
		t.Fatalf("%d calls came within a second of the last on the channel", n)
	}
}
