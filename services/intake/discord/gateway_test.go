package discord_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

func TestGatewayHandsMessagesToTheSink(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	hs := fake.WaitHandshakes(t, 1)
	if hs[0].Op != 2 || hs[0].Path != "/gateway" {
		t.Fatalf("first handshake = %+v, want IDENTIFY on /gateway", hs[0])
	}
	if want := int(discord.Intents); hs[0].Intents != want {
		t.Errorf("IDENTIFY intents = %d, want %d (GUILDS|GUILD_MESSAGES|DIRECT_MESSAGES|MESSAGE_CONTENT)", hs[0].Intents, want)
	}

	fake.MessageCreate(discordtest.MessageSpec{ID: "1001", Channel: chanID, Guild: guild, Author: alice, Content: "hello there", MentionBot: true})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1002", Channel: dmID, Author: alice, Content: "a direct message"})
	got := sink.wait(t, 2)

	want := []connector.Message{
		{Connector: "discord-main", ID: "1001", Channel: chanID, Server: guild, Author: "alice", AuthorID: alice.ID, Text: "hello there",
			Meta: map[string]string{discord.MetaAuthorID: alice.ID, discord.MetaReplyChannel: chanID}},
		{Connector: "discord-main", ID: "1002", Channel: dmID, Author: "alice", AuthorID: alice.ID, Text: "a direct message",
			Meta: map[string]string{discord.MetaAuthorID: alice.ID, discord.MetaReplyChannel: dmID, discord.MetaDM: "true"}},
	}
	for i := range want {
		if !sameMessage(got[i], want[i]) {
			t.Errorf("message %d = %+v\nwant %+v", i, got[i], want[i])
		}
	}
	st := c.Status()
	if st.Type != "discord" || st.State != connector.StateConnected || st.ConnectedSince.IsZero() || st.LastEvent.IsZero() {
		t.Errorf("Status = %+v, want a connected discord connector with a last event", st)
	}
	if !c.LongLived() {
		t.Error("a connector with a bot token is not LongLived; intake would exit idle and drop the gateway")
	}
}

func sameMessage(a, b connector.Message) bool {
	if a.Connector != b.Connector || a.ID != b.ID || a.Channel != b.Channel || a.ChannelName != b.ChannelName ||
		a.Server != b.Server || a.Thread != b.Thread || a.Author != b.Author || a.AuthorID != b.AuthorID || a.Text != b.Text || len(a.Meta) != len(b.Meta) {
		return false
	}
	for k, v := range b.Meta {
		if a.Meta[k] != v {
			return false
		}
	}
	return true
}

func TestGatewayFiltersMessages(t *testing.T) {
	t.Parallel()
	self := discordtest.User{ID: "100000000000000001", Username: "berth-bot", Bot: true} // the fake's bot id
	tests := []struct {
		name     string
		opts     func(*discord.Options)
		msg      discordtest.MessageSpec
		accepted bool
		text     string
		authorID string // Message.AuthorID when accepted: alice's id unless said
	}{
		{"Own_messages_are_ignored", nil, discordtest.MessageSpec{Author: self, Guild: guild, Content: "my own reply", MentionBot: true}, false, "", ""},
		{"Own_DMs_are_ignored", nil, discordtest.MessageSpec{Author: self, Content: "my own DM"}, false, "", ""},
		{"Other_bots_are_ignored", nil, discordtest.MessageSpec{Author: robot, Guild: guild, Content: "beep", MentionBot: true}, false, "", ""},
		{"Other_bots_pass_with_allow_bots_but_without_an_author_id", func(o *discord.Options) { o.AllowBots = true }, discordtest.MessageSpec{Author: robot, Guild: guild, Content: "beep", MentionBot: true}, true, "beep", "none"},
		{"A_webhook_message_has_no_author_id", func(o *discord.Options) { o.AllowBots = true }, discordtest.MessageSpec{Author: alice, Webhook: "990000000000000001", Guild: guild, Content: "approve run-1-a1", MentionBot: true}, true, "approve run-1-a1", "none"},
		{"Guild_messages_without_a_mention_are_ignored", nil, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "just chatting"}, false, "", ""},
		{"A_decision_on_an_approval_needs_no_mention", nil, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "deny " + keywordApprovalID}, true, "deny " + keywordApprovalID, ""},
		{"Trigger_all_takes_guild_messages_without_a_mention", func(o *discord.Options) { o.Trigger = discord.TriggerAll }, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "just chatting"}, true, "just chatting", ""},
		{"DMs_trigger_without_a_mention", nil, discordtest.MessageSpec{Author: alice, Content: "psst"}, true, "psst", ""},
		{"The_mention_is_stripped", nil, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "what time is it?", MentionBot: true}, true, "what time is it?", ""},
		{"Guilds_outside_guild_ids_are_ignored", func(o *discord.Options) { o.GuildIDs = []string{other} }, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "hi", MentionBot: true}, false, "", ""},
		{"Guilds_in_guild_ids_pass", func(o *discord.Options) { o.GuildIDs = []string{guild} }, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "hi", MentionBot: true}, true, "hi", ""},
		{"A_bare_mention_is_ignored", nil, discordtest.MessageSpec{Author: alice, Guild: guild, Content: "", MentionBot: true}, false, "", ""},
		// Attachments are files for intake to download (attachments.go), not text.
		{"Attachments_are_files_not_text", nil, discordtest.MessageSpec{Author: alice, Content: "see", Attachments: []string{"log.txt"}}, true, "see", ""},
		{"A_message_of_attachments_only_is_taken", nil, discordtest.MessageSpec{Author: alice, Attachments: []string{"log.txt"}}, true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, tt.opts)
			sink := newSink()
			run(t, c, sink)
			fake.WaitHandshakes(t, 1)
			tt.msg.ID, tt.msg.Channel = "2001", chanID
			fake.MessageCreate(tt.msg)
			// A DM from alice after it: once it arrived, the first was decided.
			fake.MessageCreate(discordtest.MessageSpec{ID: "2002", Channel: dmID, Author: alice, Content: "marker"})
			got := sink.wait(t, 1)
			if got[len(got)-1].ID != "2002" {
				got = sink.wait(t, 2)
			}
			if accepted := got[0].ID == "2001"; accepted != tt.accepted {
				t.Fatalf("message accepted = %t, want %t (sink got %+v)", accepted, tt.accepted, got)
			}
			if tt.accepted && got[0].Text != tt.text {
				t.Errorf("text = %q, want %q", got[0].Text, tt.text)
			}
			wantID := alice.ID
			if tt.authorID == "none" {
				wantID = ""
			}
			if tt.accepted && got[0].AuthorID != wantID {
				t.Errorf("AuthorID = %q, want %q (an approver is named by it)", got[0].AuthorID, wantID)
			}
			if want := len(tt.msg.Attachments); tt.accepted && (len(got[0].Files) != want || want > 0 &&
				(got[0].Files[0].Name != tt.msg.Attachments[0] || got[0].Files[0].URL != "https://cdn.example.invalid/"+tt.msg.Attachments[0])) {
				t.Errorf("files = %+v, want %v with their CDN links", got[0].Files, tt.msg.Attachments)
			}
		})
	}
}

func TestThreadMessagesKeepTheThreadAndTheReplyLandsInIt(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	const thread = "800000000000000001"
	fake.GuildCreate(guild,
		discordtest.Channel{ID: chanID, Name: "support"},
		discordtest.Channel{ID: thread, Name: "printer on fire", ParentID: chanID, Thread: true})
	fake.MessageCreate(discordtest.MessageSpec{ID: "3001", Channel: thread, Guild: guild, Author: alice, Content: "still burning", MentionBot: true})
	m := sink.wait(t, 1)[0]
	if m.Channel != chanID || m.Thread != thread || m.ChannelName != "support" || m.Server != guild {
		t.Fatalf("thread message = channel %q thread %q name %q server %q, want the parent channel, the thread, its name and the guild",
			m.Channel, m.Thread, m.ChannelName, m.Server)
	}
	err := c.Send(context.Background(), connector.Reply{RunID: "r1", MessageID: m.ID, Channel: m.Channel, Thread: m.Thread, Text: "water helps", Meta: m.Meta})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	p := fake.WaitPosts(t, 1)[0]
	if p.Channel != thread || p.Content != "water helps" || p.ReplyTo != "3001" {
		t.Errorf("post = %+v, want the reply in thread %s answering 3001", p, thread)
	}
	if err := c.Typing(context.Background(), m.Channel, m.Meta); err != nil {
		t.Fatalf("Typing: %v", err)
	}
	if ty := fake.Typing(); len(ty) != 1 || ty[0] != thread {
		t.Errorf("typing shown in %v, want the thread %s", ty, thread)
	}
}

func TestADroppedConnectionResumesAndDeliversWhatWasMissed(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	seqA := fake.MessageCreate(discordtest.MessageSpec{ID: "4001", Channel: dmID, Author: alice, Content: "before the drop"})
	sink.wait(t, 1)

	fake.Drop()
	fake.MessageCreate(discordtest.MessageSpec{ID: "4002", Channel: dmID, Author: alice, Content: "while you were away"})
	hs := fake.WaitHandshakes(t, 2)
	if r := hs[1]; r.Op != 6 || r.Path != "/resume" || r.Seq != seqA || !r.Resumed {
		t.Fatalf("second handshake = %+v, want RESUME on resume_gateway_url with seq %d", r, seqA)
	}
	fake.MessageCreate(discordtest.MessageSpec{ID: "4003", Channel: dmID, Author: alice, Content: "after the resume"})
	got := sink.wait(t, 3)
	for i, id := range []string{"4001", "4002", "4003"} {
		if got[i].ID != id {
			t.Fatalf("accepted %v, want 4001, 4002, 4003 in order", got)
		}
	}
	if st := c.Status(); st.Reconnects < 1 || st.State != connector.StateConnected {
		t.Errorf("Status = %+v, want connected with at least one reconnect", st)
	}
}

func TestARefusedResumeIdentifiesAgain(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	connected(t, fake, c)
	fake.SetAllowResume(false)
	fake.Drop()
	hs := fake.WaitHandshakes(t, 3)
	if hs[1].Op != 6 || hs[1].Resumed || hs[2].Op != 2 || hs[2].Path != "/gateway" {
		t.Fatalf("handshakes = %+v, want a refused RESUME then IDENTIFY on the gateway URL", hs)
	}
	fake.MessageCreate(discordtest.MessageSpec{ID: "5001", Channel: dmID, Author: alice, Content: "new session"})
	if got := sink.wait(t, 1); got[0].ID != "5001" {
		t.Errorf("accepted %v", got)
	}
}

func TestAnUnreachableResumeURLFallsBackToTheGatewayURL(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	gone := httptest.NewServer(nil)
	gone.Close()
	fake.ResumeURL = "ws" + strings.TrimPrefix(gone.URL, "http") + "/resume"
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	connected(t, fake, c)
	fake.Drop()
	fake.MessageCreate(discordtest.MessageSpec{ID: "5101", Channel: dmID, Author: alice, Content: "missed"})
	hs := fake.WaitHandshakes(t, 2)
	if hs[1].Op != 6 || hs[1].Path != "/gateway" || !hs[1].Resumed {
		t.Fatalf("second handshake = %+v, want a RESUME on the gateway URL", hs[1])
	}
	if got := sink.wait(t, 1); got[0].ID != "5101" {
		t.Errorf("accepted %v, want the missed message", got)
	}
}

func TestAMessageTheSinkFailedToStoreIsReplayedWithTheSameID(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, nil)
	sink := newSink()
	sink.failing(1)
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	seq := fake.MessageCreate(discordtest.MessageSpec{ID: "6001", Channel: dmID, Author: alice, Content: "do not lose me"})
	got := sink.wait(t, 1)
	if len(got) != 1 || got[0].ID != "6001" {
		t.Fatalf("stored %v, want 6001 once", got)
	}
	if calls := sink.acceptCalls(); len(calls) != 2 || calls[0] != "6001" || calls[1] != "6001" {
		t.Errorf("Accept calls = %v, want 6001 twice (failed, then replayed)", calls)
	}
	hs := fake.Handshakes()
	if len(hs) < 2 || hs[1].Op != 6 || hs[1].Seq != seq-1 {
		t.Fatalf("handshakes = %+v, want a RESUME from seq %d: the failed event was not acknowledged", hs, seq-1)
	}
	if !strings.Contains(logs.String(), "cannot hand the message to intake") {
		t.Errorf("no log line says the hand-off failed:\n%s", logs)
	}
}

func TestGarbageOnTheGatewayIsLoggedAndHandsNothingOn(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	for _, frame := range []string{
		"not json at all",
		`{"op":0,"t":"MESSAGE_CREATE","d":"a string, not a message"}`,
		`{"op":0,"t":"MESSAGE_CREATE","d":{"id":"","channel_id":""}}`,
		`{"op":0,"t":"SOMETHING_DISCORD_ADDS_LATER","s":null,"d":{}}`,
		`{"op":42,"d":null}`,
		`{"op":0,"t":"READY","d":{"session_id":""}}`,
		`[1,2,3]`,
	} {
		fake.SendRaw(websocket.MessageText, []byte(frame))
	}
	fake.SendRaw(websocket.MessageBinary, []byte{0x78, 0x9c, 0xff})
	fake.MessageCreate(discordtest.MessageSpec{ID: "7001", Channel: dmID, Author: alice, Content: "real one"})
	got := sink.wait(t, 1)
	if len(got) != 1 || got[0].ID != "7001" || len(sink.acceptCalls()) != 1 {
		t.Fatalf("accepted %v (calls %v), want only the real message", got, sink.acceptCalls())
	}
	if n := len(fake.Handshakes()); n != 1 {
		t.Errorf("%d handshakes: garbage frames made the connector reconnect", n)
	}
	for _, want := range []string{"not a JSON payload", "malformed MESSAGE_CREATE", "unknown opcode", "binary frame", "malformed READY"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line says %q", want)
		}
	}
}

func TestABrokenHandshakeIsRetriedWithoutHandingAnythingOn(t *testing.T) {
	t.Parallel()
	tests := []struct{ mode, log string }{
		{"close", "closed the connection with code 1011"},
		{"garbage", "first frame is not HELLO"},
		{"close-after-hello", "closed the connection with code 1011"},
	}
	for _, tt := range tests {
		t.Run("Gateway_that_"+tt.mode, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			fake.BreakNextHandshake(tt.mode)
			fake.BreakNextHandshake(tt.mode)
			c, logs := newConnector(t, fake, nil)
			sink := newSink()
			run(t, c, sink)
			hs := fake.WaitHandshakes(t, 1)
			if hs[len(hs)-1].Op != 2 {
				t.Fatalf("handshakes %+v, want an IDENTIFY once the gateway behaves", hs)
			}
			fake.MessageCreate(discordtest.MessageSpec{ID: "8001", Channel: dmID, Author: alice, Content: "finally"})
			sink.wait(t, 1)
			if calls := sink.acceptCalls(); len(calls) != 1 {
				t.Errorf("Accept calls %v, want just the real message", calls)
			}
			if st := c.Status(); st.Reconnects < 2 {
				t.Errorf("Reconnects = %d after two broken handshakes", st.Reconnects)
			}
			if !strings.Contains(logs.String(), tt.log) {
				t.Errorf("log does not say %q:\n%s", tt.log, logs)
			}
		})
	}
}

func TestASilentGatewayIsGivenUpAfterTheHandshakeTimeout(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	fake.BreakNextHandshake("silent")
	c, logs := newConnector(t, fake, func(o *discord.Options) { o.HandshakeTimeout = 200 * time.Millisecond })
	sink := newSink()
	run(t, c, sink)
	if hs := fake.WaitHandshakes(t, 1); hs[0].Op != 2 {
		t.Fatalf("handshake %+v, want an IDENTIFY on the next connection", hs[0])
	}
	if !strings.Contains(logs.String(), "handshake timed out") {
		t.Errorf("no log line says the handshake timed out:\n%s", logs)
	}
	if st := c.Status(); st.Reconnects < 1 {
		t.Errorf("Reconnects = %d, want the silent connection counted", st.Reconnects)
	}
}

func TestAnOversizedFrameDropsTheConnection(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, func(o *discord.Options) { o.MaxFrameBytes = 8 << 10 })
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	fake.SetAllowResume(false) // else the resume replays the same frame
	fake.MessageCreate(discordtest.MessageSpec{ID: "9001", Channel: dmID, Author: alice, Content: strings.Repeat("x", 16<<10)})
	fake.WaitHandshakes(t, 3)
	fake.MessageCreate(discordtest.MessageSpec{ID: "9002", Channel: dmID, Author: alice, Content: "small"})
	got := sink.wait(t, 1)
	if len(got) != 1 || got[0].ID != "9002" {
		t.Fatalf("accepted %v, want only the small message", got)
	}
	if !strings.Contains(logs.String(), "read limited") {
		t.Errorf("no log line names the oversized frame:\n%s", logs)
	}
}

func TestMissingMessageContentIntentIsReportedOnce(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	fake.SetContentIntent(false)
	c, logs := newConnector(t, fake, func(o *discord.Options) { o.Trigger = discord.TriggerAll })
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	fake.MessageCreate(discordtest.MessageSpec{ID: "1101", Channel: chanID, Guild: guild, Author: alice, Content: "you cannot read this"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1102", Channel: chanID, Guild: guild, Author: alice, Content: "nor this"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "1103", Channel: dmID, Author: alice, Content: "DMs keep their content"})
	got := sink.wait(t, 1)
	if len(got) != 1 || got[0].ID != "1103" {
		t.Fatalf("accepted %v, want only the DM", got)
	}
	if st := c.Status(); !strings.Contains(st.Warning, "MESSAGE_CONTENT") {
		t.Errorf("Status.Warning = %q, want it to name the MESSAGE_CONTENT intent", st.Warning)
	}
	if n := strings.Count(logs.String(), "the MESSAGE_CONTENT intent is not granted"); n != 1 {
		t.Errorf("the missing intent was logged %d times, want once", n)
	}
}

func TestGatewayRefusalsShowInStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(*discordtest.Server, *discord.Options)
		want  string
	}{
		{"Disallowed_intents_4014_name_the_MESSAGE_CONTENT_switch", func(f *discordtest.Server, _ *discord.Options) { f.RejectPrivilegedIntents() }, "MESSAGE CONTENT INTENT"},
		{"A_rejected_token_4004_says_so", func(f *discordtest.Server, o *discord.Options) {
			o.GatewayURL = f.GatewayURL
			o.BotToken = "not-the-right-token"
		}, "bot token was rejected"},
		{"A_token_GET_gateway_bot_refuses_says_so", func(f *discordtest.Server, o *discord.Options) { o.BotToken = "not-the-right-token" }, "bot token was rejected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, func(o *discord.Options) { tt.setup(fake, o) })
			run(t, c, newSink())
			eventually(t, "a status warning", func() bool { return c.Status().Warning != "" })
			st := c.Status()
			if !strings.Contains(st.Warning, tt.want) || st.State == connector.StateConnected {
				t.Errorf("Status = %+v, want a warning containing %q and not connected", st, tt.want)
			}
		})
	}
}

func TestAZombieConnectionIsDroppedAndResumed(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	fake.SetHeartbeat(1000, false) // heartbeats are never acknowledged
	clock := clockwork.NewFakeClock()
	c, logs := newConnector(t, fake, func(o *discord.Options) {
		o.Clock = clock
		o.BackoffMin, o.BackoffMax = time.Second, time.Second
	})
	run(t, c, newSink())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	connected(t, fake, c)
	// The one waiter: the first heartbeat (READY stopped the handshake deadline).
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	fake.WaitFor(t, "the first heartbeat", func() bool { return len(fake.Heartbeats()) == 1 })
	if hb := fake.Heartbeats()[0]; hb != 1 {
		t.Errorf("heartbeat carried seq %d, want 1 (READY)", hb)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // no ACK came: zombie
	eventually(t, "the zombie to be dropped", func() bool { return c.Status().State == connector.StateDisconnected })
	if !strings.Contains(logs.String(), "did not acknowledge the last heartbeat") {
		t.Errorf("no log line says the heartbeat went unacknowledged")
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the reconnect back-off
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	hs := fake.WaitHandshakes(t, 2)
	if hs[1].Op != 6 {
		t.Errorf("after a zombie connection got %+v, want a RESUME", hs[1])
	}
}

func TestCloseCodesDecideBetweenResumeAndANewSession(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   int
		wantOp int
	}{
		{4000, 6}, // unknown error: resume
		{4008, 6}, // rate limited: resume
		{1001, 6}, // the gateway going away: try to resume
		{4007, 2}, // invalid seq: new session
		{4009, 2}, // session timed out: new session
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("Close_%d", tt.code), func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, nil)
			run(t, c, newSink())
			connected(t, fake, c)
			fake.CloseWith(tt.code, "test")
			if hs := fake.WaitHandshakes(t, 2); hs[1].Op != tt.wantOp {
				t.Errorf("after close %d the connector sent op %d, want %d", tt.code, hs[1].Op, tt.wantOp)
			}
		})
	}
}

func TestTheBackoffDoublesUpToItsCapWithJitter(t *testing.T) {
	t.Parallel()
	c, err := discord.New("d", discord.Options{BotToken: "t", BackoffMin: time.Second, BackoffMax: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for n, ceiling := range map[int]float64{1: 1, 2: 2, 3: 4, 5: 16, 6: 30, 50: 30} {
		for range 20 {
			got := c.Backoff(n).Seconds()
			if got < ceiling/2 || got > ceiling {
				t.Errorf("attempt %d waits %.2fs, want between %.1fs and %.1fs", n, got, ceiling/2, ceiling)
			}
		}
	}
}

func TestServerOpcodesAreAnsweredAsDocumented(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		frame  string
		wantOp int // op of the next handshake; 0: none, a heartbeat instead
	}{
		{"Reconnect_op_7_resumes", `{"op":7,"d":null}`, 6},
		{"Resumable_invalid_session_resumes", `{"op":9,"d":true}`, 6},
		{"Invalid_session_identifies_anew", `{"op":9,"d":false}`, 2},
		{"A_heartbeat_request_op_1_is_answered_at_once", `{"op":1,"d":null}`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, nil)
			run(t, c, newSink())
			connected(t, fake, c)
			fake.SendRaw(websocket.MessageText, []byte(tt.frame))
			if tt.wantOp == 0 {
				fake.WaitFor(t, "a heartbeat", func() bool { return len(fake.Heartbeats()) == 1 })
				if hb := fake.Heartbeats()[0]; hb != 1 {
					t.Errorf("heartbeat carried seq %d, want 1", hb)
				}
				return
			}
			if hs := fake.WaitHandshakes(t, 2); hs[1].Op != tt.wantOp {
				t.Errorf("next handshake sent op %d, want %d", hs[1].Op, tt.wantOp)
			}
		})
	}
}

func TestRunEndsWithItsContextAndStatusSaysStopped(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, newSink()) }()
	connected(t, fake, c)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if st := c.Status(); st.State != connector.StateStopped || !st.ConnectedSince.IsZero() {
		t.Errorf("Status = %+v, want stopped", st)
	}
}
