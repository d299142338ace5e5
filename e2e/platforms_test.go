package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// The whole path for each chat platform: a fake platform → the real
// berth-intake → the real scheduler → a confined agent run (the local
// provider's /sh) → the reply posted back on the fake platform.

// startPlatform starts a suite with one agent "ops" and the connector block
// given; env carries the credentials the block references.
func startPlatform(t *testing.T, connectorTOML string, env []string, secrets ...string) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	cfg := fmt.Sprintf(`[providers]
primary = "local"

[[agents]]
id = "ops"
max_iterations = 4

[intake]
default_agent = "ops"

%s

[scheduler]
max_concurrent_runs = 4
default_timeout_seconds = 60
run_as = "nobody"
agent_binary = %q
`, connectorTOML, filepath.Join(binDir, "berth-agent"))
	return launch(t, nil, cfg, env, secrets...)
}

func platformCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// settle waits until intake has nothing left to hand on or deliver: a second
// run or reply could then only come from a second inbox or outbox entry.
func (s *suite) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := s.intakeStatus(t)
		pending := st.InboxPending + st.OutboxPending
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("intake still has %d pending entries after a minute", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *suite) inboxPending(t *testing.T) uint32 {
	t.Helper()
	return s.intakeStatus(t).InboxPending
}

func (s *suite) runCount(t *testing.T) int {
	t.Helper()
	return len(s.listRuns(t, busapi.ListFilter{Agent: "ops"}))
}

// killIntakeBeforeHandOff holds the scheduler (SIGSTOP) so that what deliver
// sends is stored in intake.db but not yet handed on, SIGKILLs intake there,
// lets the scheduler go on and starts a new intake through D-Bus activation,
// as systemd's Restart= would.
func (s *suite) killIntakeBeforeHandOff(t *testing.T, deliver func()) {
	t.Helper()
	c := s.conn(t)
	if err := c.Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot reach the scheduler: %v", err)
	}
	sched, err := s.ServicePID(bus.SchedulerName)
	if err != nil || sched == 0 {
		t.Fatalf("scheduler pid %d: %v", sched, err)
	}
	if err := syscall.Kill(sched, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(sched, syscall.SIGCONT)
		}
	}
	defer resume()
	deliver()
	deadline := time.Now().Add(30 * time.Second)
	for s.inboxPending(t) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the message was not stored within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.KillService(bus.IntakeName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resume()
	if err := c.Object(bus.IntakeName, bus.IntakePath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate intake again: %v", err)
	}
}

// longReply makes the agent print a fenced code block of 200 numbered lines,
// about 9,000 characters; the command holds no backtick itself.
const longReply = `/sh printf '\140\140\140\n'; i=1; while [ $i -le 200 ]; do echo "line $i of the long reply, padded to forty-five"; i=$((i+1)); done; printf '\140\140\140\n'`

var longLineRE = regexp.MustCompile(`^line (\d+) of the long reply`)

// checkChunks fails unless chunks each fit limit characters, each has
// balanced fences, and together carry lines 1..200 in order.
func checkChunks(t *testing.T, chunks []string, limit int) {
	t.Helper()
	if len(chunks) < 2 {
		t.Fatalf("a ~9,000-character reply came as %d message(s), want several", len(chunks))
	}
	next, total := 1, 0
	for i, c := range chunks {
		total += utf8.RuneCountInString(c)
		if n := utf8.RuneCountInString(c); n > limit {
			t.Fatalf("chunk %d has %d characters, over the platform's %d", i, n, limit)
		}
		fences := 0
		for _, l := range strings.Split(c, "\n") {
			if strings.HasPrefix(l, "```") {
				fences++
			}
			if m := longLineRE.FindStringSubmatch(l); m != nil {
				if n, _ := strconv.Atoi(m[1]); n != next {
					t.Fatalf("chunk %d: line %d where line %d was due", i, n, next)
				}
				next++
			}
		}
		if fences%2 != 0 {
			t.Fatalf("chunk %d leaves a code block open (%d fence lines):\n%s", i, fences, c)
		}
	}
	if total < 9000 {
		t.Fatalf("the reply was %d characters in all, want over 9,000", total)
	}
	if next != 201 {
		t.Fatalf("the chunks carried %d of the 200 lines", next-1)
	}
}

func TestPlatformMeepaChatWholePath(t *testing.T) {
	t.Parallel()
	serverID := "srv1"
	fake := meepachattest.New(meepachattest.Options{
		Token: "bot1.e2e-meepa-secret",
		Bot:   meepachattest.User{ID: "bot1", Username: "berth", Bot: true},
		Servers: []meepachattest.Server{{ID: serverID, Name: "ops", Channels: []meepachattest.Channel{
			{ID: "chan1", ServerID: &serverID, Name: "general"},
		}}},
	})
	t.Cleanup(fake.Close)
	s := startPlatform(t, fmt.Sprintf("[[connectors]]\nid = \"meepa\"\ntype = \"meepachat\"\nbase_url = %q\ntoken = \"$MEEPA_TOKEN\"\ntrigger = \"all\"\n", fake.URL),
		[]string{"MEEPA_TOKEN=bot1.e2e-meepa-secret"}, "e2e-meepa-secret")
	ctx := platformCtx(t)
	if err := fake.WaitConnections(ctx, 1, "chan1"); err != nil {
		t.Fatal(err)
	}
	alice := &meepachattest.User{ID: "u1", Username: "alice"}
	seq := 0
	send := func(t *testing.T, text, thread string) meepachattest.Message {
		t.Helper()
		seq++
		m := meepachattest.Message{ID: fmt.Sprintf("m%d", seq), ChannelID: "chan1", UserID: alice.ID, User: alice, ThreadID: thread, Content: text}
		if n, err := fake.Deliver(ctx, m); err != nil || n != 1 {
			t.Fatalf("deliver %s: %d connections got it (%v)", m.ID, n, err)
		}
		return m
	}
	posts := 0
	waitPosts := func(t *testing.T, n int) []meepachattest.Posted {
		t.Helper()
		got, err := fake.WaitPosted(ctx, posts+n)
		if err != nil {
			t.Fatal(err)
		}
		out := got[posts:]
		posts = len(got)
		return out
	}
	runs := 0

	t.Run("A message gets the agent's reply in its thread", func(t *testing.T) {
		send(t, "/sh echo meepa-hello", "thread-7")
		p := waitPosts(t, 1)[0]
		if !strings.Contains(p.Content, "meepa-hello") || p.ChannelID != "chan1" || p.ServerID != serverID || p.ThreadID != "thread-7" {
			t.Fatalf("posted %+v: want the shell output in chan1 of %s, thread thread-7", p, serverID)
		}
		runs++
	})
	t.Run("A duplicate delivery runs once and replies once", func(t *testing.T) {
		m := send(t, "/sh echo meepa-once", "")
		if _, err := fake.Deliver(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitPosts(t, 1)
		runs++
		s.settle(t)
		if got := fake.Posted(); len(got) != posts {
			t.Fatalf("%d posts after one message delivered twice, want %d", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
	t.Run("The bot's own messages start no run", func(t *testing.T) {
		seq++
		own := meepachattest.Message{ID: fmt.Sprintf("m%d", seq), ChannelID: "chan1", UserID: "bot1", User: &meepachattest.User{ID: "bot1", Username: "berth", Bot: true}, Content: "/sh echo own"}
		if _, err := fake.Deliver(ctx, own); err != nil {
			t.Fatal(err)
		}
		// A later message's reply proves the own one was read before it.
		send(t, "/sh echo after-own", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-own") {
			t.Fatalf("posted %q, want the reply to the later message", p.Content)
		}
		runs++
		s.settle(t)
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d: the bot's own message ran", n, runs)
		}
	})
	t.Run("A long reply with a code block arrives in fenced chunks within 4000 characters", func(t *testing.T) {
		send(t, longReply, "thread-long")
		// The reply's first chunk starts it; waitPosts may already
		// have seen more than one, so the chunks are counted from before it.
		first := posts
		waitPosts(t, 1)
		s.settle(t)
		got := fake.Posted()[first:]
		posts = first + len(got)
		runs++
		var chunks []string
		for _, p := range got {
			if p.ThreadID != "thread-long" {
				t.Fatalf("a chunk went to thread %q, want thread-long", p.ThreadID)
			}
			chunks = append(chunks, p.Content)
		}
		checkChunks(t, chunks, meepachattest.MaxContent)
	})
	t.Run("A 429 with Retry-After delays the reply but loses nothing", func(t *testing.T) {
		sent := time.Now()
		fake.RateLimit("1")
		send(t, "/sh echo after-429", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-429") {
			t.Fatalf("posted %q", p.Content)
		}
		if d := time.Since(sent); d < time.Second {
			t.Fatalf("the reply came %v after the message: the 1 s Retry-After was not honoured", d)
		}
		runs++
	})
	t.Run("After the gateway drops the connection a message still gets its reply", func(t *testing.T) {
		n := fake.Connections()
		fake.DropConnections()
		if err := fake.WaitConnections(ctx, n+1, "chan1"); err != nil {
			t.Fatal(err)
		}
		send(t, "/sh echo after-drop", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-drop") {
			t.Fatalf("posted %q", p.Content)
		}
		runs++
	})
	t.Run("Intake SIGKILLed after storing a message runs it once after restart", func(t *testing.T) {
		n := fake.Connections()
		s.killIntakeBeforeHandOff(t, func() { send(t, "/sh echo survived-kill", "") })
		if err := fake.WaitConnections(ctx, n+1, "chan1"); err != nil {
			t.Fatal(err)
		}
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "survived-kill") {
			t.Fatalf("posted %q", p.Content)
		}
		runs++
		s.settle(t)
		if got := fake.Posted(); len(got) != posts {
			t.Fatalf("%d posts, want %d: the killed message was answered twice", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
}

func TestPlatformDiscordWholePath(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	s := startPlatform(t, fmt.Sprintf("[[connectors]]\nid = \"dc\"\ntype = \"discord\"\nbase_url = %q\ntoken = \"$DISCORD_TOKEN\"\ntrigger = \"all\"\n", fake.URL),
		[]string{"DISCORD_TOKEN=" + fake.Token}, fake.Token)
	fake.WaitHandshakes(t, 1)
	const guild, channel, thread = "300000000000000001", "300000000000000002", "300000000000000003"
	fake.GuildCreate(guild, discordtest.Channel{ID: channel, Name: "general"}, discordtest.Channel{ID: thread, Name: "a thread", ParentID: channel, Thread: true})
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	seq := 0
	send := func(t *testing.T, ch, text string) discordtest.MessageSpec {
		seq++
		m := discordtest.MessageSpec{ID: strconv.Itoa(500000000000000000 + seq), Channel: ch, Guild: guild, Author: alice, Content: text}
		fake.MessageCreate(m)
		return m
	}
	posts := 0
	waitPosts := func(t *testing.T, n int) []discordtest.Post {
		t.Helper()
		got := fake.WaitPosts(t, posts+n)
		out := got[posts:]
		posts = len(got)
		return out
	}
	runs := 0

	t.Run("A message in a thread gets the agent's reply in that thread", func(t *testing.T) {
		send(t, thread, "/sh echo discord-hello")
		p := waitPosts(t, 1)[0]
		if !strings.Contains(p.Content, "discord-hello") || p.Channel != thread {
			t.Fatalf("posted %+v: want the shell output in thread %s", p, thread)
		}
		runs++
	})
	t.Run("A duplicate delivery runs once and replies once", func(t *testing.T) {
		m := send(t, channel, "/sh echo discord-once")
		fake.MessageCreate(m)
		waitPosts(t, 1)
		runs++
		s.settle(t)
		if got := fake.Posts(); len(got) != posts {
			t.Fatalf("%d posts after one message delivered twice, want %d", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
	t.Run("The bot's own messages start no run", func(t *testing.T) {
		seq++
		fake.MessageCreate(discordtest.MessageSpec{ID: strconv.Itoa(500000000000000000 + seq), Channel: channel, Guild: guild, Author: discordtest.User{ID: fake.BotID, Username: "berth-bot", Bot: true}, Content: "/sh echo own"})
		send(t, channel, "/sh echo after-own")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-own") {
			t.Fatalf("posted %q, want the reply to the later message", p.Content)
		}
		runs++
		s.settle(t)
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d: the bot's own message ran", n, runs)
		}
	})
	t.Run("A long reply with a code block arrives in fenced chunks within 2000 characters", func(t *testing.T) {
		send(t, channel, longReply)
		// The reply's first chunk starts it; waitPosts may already
		// have seen more than one, so the chunks are counted from before it.
		first := posts
		waitPosts(t, 1)
		s.settle(t)
		got := fake.Posts()[first:]
		posts = first + len(got)
		runs++
		var chunks []string
		for _, p := range got {
			if p.Channel != channel {
				t.Fatalf("a chunk went to channel %q, want %s", p.Channel, channel)
			}
			chunks = append(chunks, p.Content)
		}
		checkChunks(t, chunks, 2000)
	})
	t.Run("A 429 with Retry-After delays the reply but loses nothing", func(t *testing.T) {
		sent := time.Now()
		fake.RateLimitNext(discordtest.Limit{RetryAfter: 1})
		send(t, channel, "/sh echo after-429")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-429") {
			t.Fatalf("posted %q", p.Content)
		}
		if d := time.Since(sent); d < time.Second {
			t.Fatalf("the reply came %v after the message: the 1 s Retry-After was not honoured", d)
		}
		runs++
	})
	t.Run("After the gateway drops the connection the session resumes and a message gets its reply", func(t *testing.T) {
		n := len(fake.Handshakes())
		fake.Drop()
		hs := fake.WaitHandshakes(t, n+1)
		if last := hs[len(hs)-1]; last.Op != 6 || !last.Resumed {
			t.Fatalf("reconnect handshake %+v: want a RESUME that was honoured", last)
		}
		send(t, channel, "/sh echo after-drop")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "after-drop") {
			t.Fatalf("posted %q", p.Content)
		}
		runs++
	})
	t.Run("Intake SIGKILLed after storing a message runs it once though Discord sends it again", func(t *testing.T) {
		n := len(fake.Handshakes())
		var m discordtest.MessageSpec
		s.killIntakeBeforeHandOff(t, func() { m = send(t, channel, "/sh echo survived-kill") })
		fake.WaitHandshakes(t, n+1)
		// The new session gets the message again (a client that had not
		// acknowledged it would be sent it again on RESUME).
		fake.MessageCreate(m)
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Content, "survived-kill") {
			t.Fatalf("posted %q", p.Content)
		}
		runs++
		s.settle(t)
		if got := fake.Posts(); len(got) != posts {
			t.Fatalf("%d posts, want %d: the killed message was answered twice", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
}

// startSlackPlatform is the suite with one Socket Mode connector "sl" on a
// fake Slack holding these tokens, connected; extra is more of the
// connector's TOML keys.
func startSlackPlatform(t *testing.T, appToken, botToken, extra string) (*slacktest.Server, *suite, context.Context) {
	t.Helper()
	fake := slacktest.New(t, slacktest.Options{AppToken: appToken, BotToken: botToken})
	o := fake.Options()
	s := startPlatform(t, fmt.Sprintf("[[connectors]]\nid = \"sl\"\ntype = \"slack\"\nbase_url = %q\napp_token = \"$SLACK_APP\"\nbot_token = \"$SLACK_BOT\"\ntrigger = \"all\"\n%s", fake.APIURL(), extra),
		[]string{"SLACK_APP=" + o.AppToken, "SLACK_BOT=" + o.BotToken}, o.AppToken, o.BotToken)
	ctx := platformCtx(t)
	if err := fake.WaitConnections(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return fake, s, ctx
}

func TestPlatformSlackSocketModeWholePath(t *testing.T) {
	t.Parallel()
	fake, s, ctx := startSlackPlatform(t, "xapp-1-e2e-app-secret", "xoxb-e2e-bot-secret", "")
	o := fake.Options()
	const channel = "C0CHAN"
	seq := 0
	event := func(text, threadTS string) slacktest.Event {
		seq++
		ts := fmt.Sprintf("1700000000.%06d", seq)
		return slacktest.Event{Type: "message", Channel: channel, ChannelType: "channel", User: "U0ALICE", Text: text, TS: ts, ThreadTS: threadTS, Team: o.TeamID}
	}
	send := func(t *testing.T, text, threadTS string) (slacktest.Event, string) {
		t.Helper()
		ev := event(text, threadTS)
		env, err := fake.Deliver(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return ev, env
	}
	posts := 0
	waitPosts := func(t *testing.T, n int) []slacktest.Post {
		t.Helper()
		got, err := fake.WaitPosts(ctx, posts+n)
		if err != nil {
			t.Fatal(err)
		}
		out := got[posts:]
		posts = len(got)
		return out
	}
	runs := 0

	t.Run("A message gets the agent's reply in its thread", func(t *testing.T) {
		ev, env := send(t, "/sh echo slack-hello", "")
		if err := fake.WaitAck(ctx, env); err != nil {
			t.Fatal(err)
		}
		p := waitPosts(t, 1)[0]
		if !strings.Contains(p.Text, "slack-hello") || p.Channel != channel || p.ThreadTS != ev.TS {
			t.Fatalf("posted %+v: want the shell output in %s, thread %s", p, channel, ev.TS)
		}
		runs++
	})
	t.Run("A redelivered envelope runs once and replies once", func(t *testing.T) {
		_, env := send(t, "/sh echo slack-once", "")
		if _, err := fake.Redeliver(ctx, env); err != nil {
			t.Fatal(err)
		}
		waitPosts(t, 1)
		runs++
		s.settle(t)
		if got := fake.Posts(); len(got) != posts {
			t.Fatalf("%d posts after one event delivered twice, want %d", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
	t.Run("The bot's own messages start no run", func(t *testing.T) {
		own := event("/sh echo own", "")
		own.User, own.BotID = o.BotUserID, o.BotID
		if _, err := fake.Deliver(ctx, own); err != nil {
			t.Fatal(err)
		}
		send(t, "/sh echo after-own", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Text, "after-own") {
			t.Fatalf("posted %q, want the reply to the later message", p.Text)
		}
		runs++
		s.settle(t)
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d: the bot's own message ran", n, runs)
		}
	})
	t.Run("A long reply with a code block arrives in fenced chunks within 4000 characters", func(t *testing.T) {
		ev, _ := send(t, longReply, "1699999999.000001")
		// The reply's first chunk starts it; waitPosts may already
		// have seen more than one, so the chunks are counted from before it.
		first := posts
		waitPosts(t, 1)
		s.settle(t)
		got := fake.Posts()[first:]
		posts = first + len(got)
		runs++
		var chunks []string
		for _, p := range got {
			if p.ThreadTS != ev.ThreadTS {
				t.Fatalf("a chunk went to thread %q, want %s", p.ThreadTS, ev.ThreadTS)
			}
			chunks = append(chunks, p.Text)
		}
		checkChunks(t, chunks, 4000)
	})
	t.Run("A 429 with Retry-After delays the reply but loses nothing", func(t *testing.T) {
		sent := time.Now()
		fake.RateLimit(time.Second)
		send(t, "/sh echo after-429", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Text, "after-429") {
			t.Fatalf("posted %q", p.Text)
		}
		if d := time.Since(sent); d < time.Second {
			t.Fatalf("the reply came %v after the message: the 1 s Retry-After was not honoured", d)
		}
		runs++
	})
	t.Run("After the socket drops a message on the new socket still gets its reply", func(t *testing.T) {
		n := fake.Connections()
		fake.Drop()
		if err := fake.WaitConnections(ctx, n+1); err != nil {
			t.Fatal(err)
		}
		send(t, "/sh echo after-drop", "")
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Text, "after-drop") {
			t.Fatalf("posted %q", p.Text)
		}
		runs++
	})
	t.Run("Intake SIGKILLed after storing an event runs it once though Slack redelivers it", func(t *testing.T) {
		n := fake.Connections()
		var env string
		s.killIntakeBeforeHandOff(t, func() { _, env = send(t, "/sh echo survived-kill", "") })
		if err := fake.WaitConnections(ctx, n+1); err != nil {
			t.Fatal(err)
		}
		// Whether or not the ack left before the kill, Slack may retry.
		if _, err := fake.Redeliver(ctx, env); err != nil {
			t.Fatal(err)
		}
		if p := waitPosts(t, 1)[0]; !strings.Contains(p.Text, "survived-kill") {
			t.Fatalf("posted %q", p.Text)
		}
		runs++
		s.settle(t)
		if got := fake.Posts(); len(got) != posts {
			t.Fatalf("%d posts, want %d: the killed event was answered twice", len(got), posts)
		}
		if n := s.runCount(t); n != runs {
			t.Fatalf("%d runs, want %d", n, runs)
		}
	})
}

func TestPlatformDiscordInteractionsAndSlackEventsAPIOverHTTP(t *testing.T) {
	t.Parallel()
	dc := discordtest.New(t)
	sl := slacktest.New(t, slacktest.Options{BotToken: "xoxb-e2e-events-bot-secret"})
	const signing = "e2e-slack-signing-secret"
	blocks := fmt.Sprintf(`[[connectors]]
id = "dci"
type = "discord"
base_url = %q
public_key = %q
application_id = %q

[[connectors]]
id = "slev"
type = "slack"
mode = "events"
base_url = %q
bot_token = "$SLACK_BOT"
signing_secret = "$SLACK_SIGN"
trigger = "all"
`, dc.URL, hex.EncodeToString(dc.PublicKey), dc.AppID, sl.APIURL())
	s := startPlatform(t, blocks, []string{"SLACK_BOT=" + sl.Options().BotToken, "SLACK_SIGN=" + signing}, sl.Options().BotToken, signing)
	ctx := platformCtx(t)
	client := &http.Client{Timeout: 30 * time.Second}

	t.Run("A Discord slash command is deferred at once and answered by a follow-up", func(t *testing.T) {
		body, token := dc.Command(discordtest.CommandSpec{ID: "600000000000000001", Channel: "600000000000000002", Guild: "600000000000000003",
			User: discordtest.User{ID: "600000000000000004", Username: "alice"}, Name: "ask", Options: map[string]string{"prompt": "/sh echo slash-hello"}})
		resp, err := client.Do(dc.SignedRequest(s.IntakeURL+"/hooks/dci", body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r struct {
			Type int `json:"type"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || r.Type != 5 {
			t.Fatalf("slash command answered %d %s, want 200 with a deferred response (type 5)", resp.StatusCode, b)
		}
		p := dc.WaitPosts(t, 1)[0]
		if p.Webhook != dc.AppID+"/"+token || !strings.Contains(p.Content, "slash-hello") {
			t.Fatalf("follow-up %+v: want the shell output on the interaction's webhook", p)
		}
	})
	t.Run("A Discord interaction with a bad signature is refused 401 and runs nothing", func(t *testing.T) {
		body, _ := dc.Command(discordtest.CommandSpec{ID: "600000000000000009", Channel: "600000000000000002", Guild: "600000000000000003",
			User: discordtest.User{ID: "600000000000000004", Username: "alice"}, Name: "ask", Options: map[string]string{"prompt": "/sh echo forged"}})
		req := dc.SignedRequest(s.IntakeURL+"/hooks/dci", body)
		req.Header.Set("X-Signature-Ed25519", strings.Repeat("00", 64))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("forged interaction answered %d, want 401", resp.StatusCode)
		}
		if n := s.inboxPending(t); n != 0 {
			t.Fatalf("InboxPending = %d after a forged interaction, want 0", n)
		}
	})
	t.Run("A Slack Events API message delivered twice runs once and is answered in its thread", func(t *testing.T) {
		ev := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "/sh echo events-hello", TS: "1700000001.000001", Team: sl.Options().TeamID}
		for i := range 2 {
			status, err := sl.PostEvent(ctx, s.IntakeURL+"/hooks/slev", signing, ev)
			if err != nil || status != http.StatusOK {
				t.Fatalf("event POST %d: %d %v, want 200", i, status, err)
			}
		}
		posts, err := sl.WaitPosts(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p := posts[0]; !strings.Contains(p.Text, "events-hello") || p.ThreadTS != ev.TS || p.Channel != "C0CHAN" {
			t.Fatalf("posted %+v: want the shell output in C0CHAN, thread %s", p, ev.TS)
		}
		s.settle(t)
		if n := len(sl.Posts()); n != 1 {
			t.Fatalf("%d posts for one event delivered twice, want 1", n)
		}
	})
	t.Run("A Slack event with a bad signature is refused and runs nothing", func(t *testing.T) {
		ev := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "/sh echo forged", TS: "1700000001.000002"}
		status, err := sl.PostEvent(ctx, s.IntakeURL+"/hooks/slev", "not-the-signing-secret", ev)
		if err != nil || status != http.StatusUnauthorized {
			t.Fatalf("forged event: %d %v, want 401", status, err)
		}
		if n := s.inboxPending(t); n != 0 {
			t.Fatalf("InboxPending = %d after a forged event, want 0", n)
		}
	})
	s.settle(t)
	if n := s.runCount(t); n != 2 {
		t.Fatalf("%d runs, want 2: one slash command and one Slack event", n)
	}
}
