package intake

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// discordIntake is an intake with one Discord connector "dc" (trigger all,
// every message to agent helper) against fake, on the state directory dir.
type discordIntake struct {
	t   *testing.T
	dir string
	cfg *config.Config
	sub *countingSubmitter

	svc    *Service
	cancel context.CancelFunc
	done   chan struct{}
}

func newDiscordIntake(t *testing.T, fake *discordtest.Server) *discordIntake {
	t.Helper()
	token := filepath.Join(t.TempDir(), "discord.token")
	if err := os.WriteFile(token, []byte(fake.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &discordIntake{
		t:   t,
		dir: t.TempDir(),
		sub: newCountingSubmitter(),
		cfg: &config.Config{Connectors: []config.Connector{{
			ID: "dc", Type: config.ConnectorDiscord, BaseURL: fake.URL, Token: token,
			TLSVerify: true, Trigger: "all", DefaultAgent: "helper",
		}}},
	}
}

// start opens the state directory and runs intake on it.
func (d *discordIntake) start() *Service {
	d.t.Helper()
	s, err := New(d.cfg, d.dir,
		WithLogger(slog.New(slog.NewTextHandler(testWriter{d.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithRetryDelays(10*time.Millisecond, 100*time.Millisecond),
		WithSubmitter(d.sub))
	if err != nil {
		d.t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.svc, d.cancel, d.done = s, cancel, make(chan struct{})
	go func() { defer close(d.done); _ = s.Run(ctx) }()
	d.t.Cleanup(d.stop)
	return s
}

// stop ends Run and closes the database, as systemctl stop does.
func (d *discordIntake) stop() {
	if d.svc == nil {
		return
	}
	d.cancel()
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.t.Error("Run did not return within 10s of cancel")
	}
	if err := d.svc.Close(); err != nil {
		d.t.Errorf("Close: %v", err)
	}
	d.svc = nil
}

// waitConnected waits until the connector has read READY (or RESUMED).
func (d *discordIntake) waitConnected(s *Service) {
	d.t.Helper()
	eventually(d.t, "the discord connector is connected", func() bool {
		st := s.ConnectorStatuses()
		return len(st) == 1 && st[0].State == "connected"
	})
}

func TestDiscordMessagesSentWhileIntakeWasStoppedAreAnsweredOnceAfterTheRestart(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	alice := discordtest.User{ID: "500000000000000001", Username: "alice"}
	const guild, channel, thread = "600000000000000001", "700000000000000001", "800000000000000001"
	send := func(id, where string) {
		fake.MessageCreate(discordtest.MessageSpec{ID: id, Channel: where, Guild: guild, Author: alice, Content: "message " + id})
	}
	d := newDiscordIntake(t, fake)

	d.start()
	fake.WaitHandshakes(t, 1)
	fake.GuildCreate(guild, discordtest.Channel{ID: channel, Name: "general"},
		discordtest.Channel{ID: thread, Name: "a thread", ParentID: channel, Thread: true})
	send("1000", channel)
	eventually(t, "message 1000 is submitted", func() bool { return d.sub.callsFor("dc/1000") == 1 })
	d.stop()

	// Sent while intake is down: Discord keeps them for a RESUME.
	send("1001", channel)
	send("1002", thread) // a resumed session has no GUILD_CREATE: the thread is looked up
	send("1003", channel)

	s := d.start()
	hs := fake.WaitHandshakes(t, 2)
	if r := hs[1]; r.Op != 6 || !r.Resumed {
		t.Fatalf("handshake after the restart = %+v, want an honoured RESUME of the kept session", r)
	}
	ids := []string{"1000", "1001", "1002", "1003"}
	eventually(t, "the three messages are submitted", func() bool {
		return d.sub.callsFor("dc/1001") > 0 && d.sub.callsFor("dc/1002") > 0 && d.sub.callsFor("dc/1003") > 0
	})
	if m, _, _ := s.store.message("dc", "1002"); m.Channel != channel || m.Thread != thread || m.ChannelName != "general" {
		t.Errorf("thread message stored with channel %q thread %q name %q, want the parent channel %s, the thread and the parent's name", m.Channel, m.Thread, m.ChannelName, channel)
	}
	for i, id := range ids {
		err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-" + strconv.Itoa(i), "message_id": "dc/" + id, "connector": "dc", "state": "succeeded", "text": "answer to " + id}))
		if err != nil {
			t.Fatalf("Deliver: %v", err)
		}
	}
	posts := fake.WaitPosts(t, len(ids))
	answers := map[string]int{}
	for _, p := range posts {
		answers[p.ReplyTo]++
	}
	for _, id := range ids {
		if d.sub.callsFor("dc/"+id) != 1 || answers[id] != 1 {
			t.Errorf("message %s: submitted %d times, answered %d times; want once each", id, d.sub.callsFor("dc/"+id), answers[id])
		}
	}
	if len(posts) != len(ids) {
		t.Errorf("%d posts, want %d: %+v", len(posts), len(ids), posts)
	}
}

func TestADiscordReplyWhoseAnswerWasLostIsPostedOnceWhenTheOutboxRetries(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	d := newDiscordIntake(t, fake)
	s := d.start()
	fake.WaitHandshakes(t, 1)
	fake.MessageCreate(discordtest.MessageSpec{ID: "2001", Channel: "700000000000000009",
		Author: discordtest.User{ID: "500000000000000001", Username: "alice"}, Content: "a direct message"})
	eventually(t, "the message is submitted", func() bool { return d.sub.callsFor("dc/2001") == 1 })

	// The message is made, then the connection is cut before the answer: the
	// outbox does not know it was delivered and sends it again.
	fake.LoseNextResponses(1)
	runID := "20261202T003450_123456789_0a1b2c3d4e" // the scheduler's form: longer than a nonce may be
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": runID, "message_id": "dc/2001", "connector": "dc", "state": "succeeded", "text": "once"})); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	fake.WaitFor(t, "the reply to be posted again", func() bool { return fake.PostRequests() >= 2 })
	eventually(t, "the reply is marked delivered", func() bool {
		_, outbox := s.store.pendingCounts()
		return outbox == 0
	})
	posts := fake.Posts()
	if len(posts) != 1 {
		t.Fatalf("%d messages on Discord after %d POSTs, want 1: %+v", len(posts), fake.PostRequests(), posts)
	}
	if p := posts[0]; !p.EnforceNonce || p.Nonce == "" || len(p.Nonce) > 25 {
		t.Errorf("post = %+v, want a nonce of at most 25 characters with enforce_nonce", p)
	}
}

func TestAKeptDiscordSessionThatDiscordForgotStartsANewOneAfterTheRestart(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	alice := discordtest.User{ID: "500000000000000001", Username: "alice"}
	const dm = "700000000000000009"
	d := newDiscordIntake(t, fake)
	d.waitConnected(d.start())
	d.stop()

	fake.SetAllowResume(false) // down too long: Discord answers op 9, d false
	s := d.start()
	hs := fake.WaitHandshakes(t, 3)
	if hs[1].Op != 6 || hs[1].Resumed || hs[2].Op != 2 {
		t.Fatalf("handshakes after the restart = %+v, want the refused RESUME, then IDENTIFY", hs[1:])
	}
	fake.MessageCreate(discordtest.MessageSpec{ID: "3001", Channel: dm, Author: alice, Content: "after the new session"})
	eventually(t, "the message is submitted", func() bool { return d.sub.callsFor("dc/3001") == 1 })
	eventually(t, "the new session is kept", func() bool {
		kept, err := s.GatewaySession("dc")
		return err == nil && len(kept) > 0 && !bytes.Contains(kept, []byte(hs[1].SessionID))
	})
}
