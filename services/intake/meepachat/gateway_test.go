package meepachat

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
)

func TestInboundMessagesReachTheSinkWithWhatTheReplyNeeds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   meepachattest.Message
		want connector.Message
	}{
		{
			name: "A_server_channel_message_carries_its_server_and_channel_name",
			in:   human("m-1", "hello berth"),
			want: connector.Message{Connector: "chat", ID: "m-1", Channel: channelID, ChannelName: "general",
				Server: serverID, Author: "u-alice", AuthorID: "u-alice", Text: "hello berth", Meta: map[string]string{MetaServer: serverID}},
		},
		{
			name: "A_message_in_a_thread_keeps_the_thread",
			in: func() meepachattest.Message {
				m := human("m-2", "in a thread")
				m.ThreadID = "m-root"
				return m
			}(),
			want: connector.Message{Connector: "chat", ID: "m-2", Channel: channelID, ChannelName: "general",
				Server: serverID, Thread: "m-root", Author: "u-alice", AuthorID: "u-alice", Text: "in a thread", Meta: map[string]string{MetaServer: serverID}},
		},
		{
			name: "A_DM_is_marked_as_one_and_has_no_server",
			in: meepachattest.Message{ID: "m-3", ChannelID: dmID, UserID: "u-alice", Content: "psst",
				User: &meepachattest.User{ID: "u-alice"}},
			want: connector.Message{Connector: "chat", ID: "m-3", Channel: dmID, Author: "u-alice", AuthorID: "u-alice", Text: "psst",
				Meta: map[string]string{MetaDM: "true"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			c, _ := newTestConnector(t, f, nil)
			sink := newSink()
			connected(ctx, t, f, c, sink)
			deliver(ctx, t, f, tt.in)
			got := sink.wait(ctx, t, 1)[0]
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("accepted\n %+v\nwant\n %+v", got, tt.want)
			}
			if st := c.Status(); st.LastEvent.IsZero() || st.ConnectedSince.IsZero() {
				t.Errorf("status after a message = %+v, want connected since and last event set", st)
			}
		})
	}
}

func TestTheBotsLeadingMentionIsStrippedLikeOnSlackAndDiscord(t *testing.T) {
	t.Parallel()
	byID := func(id, content string) meepachattest.Message {
		m := human(id, content)
		m.Mentions = []meepachattest.Mention{{ID: testBotID}}
		return m
	}
	tests := []struct {
		name string
		in   meepachattest.Message
		want string
	}{
		{"A_username_mention_before_a_command", human("m-1", "@berth /sh ls -l"), "/sh ls -l"},
		{"An_id_mention_with_whitespace_around_it", byID("m-2", "  <@bot-7f3a>\t status  "), "status"},
		{"A_mention_in_another_case", human("m-3", "@Berth hello"), "hello"},
		{"A_mention_later_in_the_text_stays", human("m-4", "ask @berth later"), "ask @berth later"},
		{"A_longer_name_is_not_the_bots_mention", human("m-5", "@berthold hi"), "@berthold hi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			c, _ := newTestConnector(t, f, func(o *Options) { o.Trigger = TriggerAll })
			sink := newSink()
			connected(ctx, t, f, c, sink)
			deliver(ctx, t, f, tt.in)
			if got := sink.wait(ctx, t, 1)[0].Text; got != tt.want {
				t.Errorf("text handed on = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMessagesNotForTheAgentAreIgnored(t *testing.T) {
	t.Parallel()
	own := meepachattest.Message{ID: "m-own", ChannelID: channelID, UserID: testBotID, Content: "my own reply",
		User: &meepachattest.User{ID: testBotID, Bot: true}}
	otherBot := meepachattest.Message{ID: "m-bot", ChannelID: channelID, UserID: "u-ci", Content: "build passed",
		User: &meepachattest.User{ID: "u-ci", Username: "ci", Bot: true}}
	plain := human("m-plain", "anyone around?")
	mention := human("m-mention", "@berth what is the time?")
	mentionByID := human("m-mention-id", "<@bot-7f3a> status")
	mentionByID.Mentions = []meepachattest.Mention{{ID: testBotID}}
	dm := meepachattest.Message{ID: "m-dm", ChannelID: dmID, UserID: "u-alice", Content: "no mention needed",
		User: &meepachattest.User{ID: "u-alice"}}
	tests := []struct {
		name     string
		edit     func(*Options)
		in       []meepachattest.Message
		accepted []string
	}{
		{"The_bots_own_messages_are_ignored", nil, []meepachattest.Message{own, plain}, []string{"m-plain"}},
		{"Other_bots_are_ignored_by_default", nil, []meepachattest.Message{otherBot, plain}, []string{"m-plain"}},
		{"Other_bots_are_heard_when_allowed_but_never_the_bot_itself",
			func(o *Options) { o.AllowBots = true }, []meepachattest.Message{own, otherBot}, []string{"m-bot"}},
		{"With_trigger_mention_only_mentions_and_DMs_are_heard",
			func(o *Options) { o.Trigger = TriggerMention },
			[]meepachattest.Message{plain, mention, mentionByID, dm}, []string{"m-mention", "m-mention-id", "m-dm"}},
		{"Without_a_trigger_only_mentions_and_DMs_are_heard",
			func(o *Options) { o.Trigger = "" },
			[]meepachattest.Message{plain, mention, mentionByID, dm}, []string{"m-mention", "m-mention-id", "m-dm"}},
		{"With_trigger_mention_a_decision_on_an_approval_is_heard_without_one",
			func(o *Options) { o.Trigger = TriggerMention },
			[]meepachattest.Message{human("m-approve", "approve 20261203T111500_123456789_abcdef0123-0123456789abcdef"),
				human("m-allow", "allow everything")}, []string{"m-approve"}},
		{"A_message_that_is_only_the_mention_is_ignored",
			func(o *Options) { o.Trigger = TriggerMention },
			[]meepachattest.Message{human("m-only", " @berth  "), mention}, []string{"m-mention"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			c, _ := newTestConnector(t, f, tt.edit)
			sink := newSink()
			connected(ctx, t, f, c, sink)
			for _, m := range tt.in {
				deliver(ctx, t, f, m)
			}
			// A last message that is always heard: once it is in, everything
			// before it was decided.
			deliver(ctx, t, f, meepachattest.Message{ID: "m-marker", ChannelID: dmID, UserID: "u-bob", Content: "marker"})
			got := ids(sink.wait(ctx, t, len(tt.accepted)+1))
			want := append(append([]string(nil), tt.accepted...), "m-marker")
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("accepted %v, want %v", got, want)
			}
		})
	}
}

func TestNewChannelsAndServersAreSubscribedAndHeard(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	sink := newSink()
	connected(ctx, t, f, c, sink)

	if err := f.AddChannel(ctx, serverID, meepachattest.Channel{ID: "ch-new", Name: "new"}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddServer(ctx, meepachattest.Server{ID: "srv-2", Name: "Work", Channels: []meepachattest.Channel{
		{ID: "ch-work", ServerID: strp("srv-2"), Name: "work"}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitConnections(ctx, 1, "ch-new", "ch-work"); err != nil {
		t.Fatal(err)
	}
	deliver(ctx, t, f, meepachattest.Message{ID: "m-work", ChannelID: "ch-work", UserID: "u-alice", Content: "deploy?"})
	got := sink.wait(ctx, t, 1)[0]
	if got.Server != "srv-2" || got.ChannelName != "work" || got.Meta[MetaServer] != "srv-2" {
		t.Errorf("message in a server added after ready = %+v, want server srv-2, channel name work", got)
	}
}

func TestSubscribingToManyChannelsStaysWithinTheFrameLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	o := testOptions()
	var chans []meepachattest.Channel
	for i := range 400 {
		chans = append(chans, meepachattest.Channel{ID: fmt.Sprintf("550e8400-e29b-41d4-a716-%012d", i), ServerID: strp(serverID), Name: fmt.Sprint("c", i)})
	}
	o.Servers[0].Channels = append(o.Servers[0].Channels, chans...)
	f := newFake(t, o)
	c, _ := newTestConnector(t, f, nil)
	start(t, c, newSink())
	// The fake closes a connection that sends more than 4,096 bytes in a frame.
	if err := f.WaitConnections(ctx, 1, chans[0].ID, chans[199].ID, chans[399].ID, channelID, dmID); err != nil {
		t.Fatal(err)
	}
	var subs int
	for _, fr := range f.Frames(1) {
		if fr.Type == "subscribe" {
			subs++
		}
	}
	if subs < 2 {
		t.Errorf("%d subscribe frames for 403 channels, want them split over several", subs)
	}
	if n := f.Connections(); n != 1 {
		t.Errorf("%d connections, want 1 (an oversized frame gets the bot dropped)", n)
	}
}

func TestSubscribeFramesNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		ids         []string
		wantSkipped int
	}{
		{"No_channels_give_no_frame", nil, 0},
		{"Many_ids_are_split", func() []string {
			var s []string
			for i := range 1000 {
				s = append(s, fmt.Sprintf("id-%06d-%s", i, strings.Repeat("x", 20)))
			}
			return s
		}(), 0},
		{"An_id_too_long_for_any_frame_is_skipped", []string{"ok", strings.Repeat("y", 5000), "also-ok"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			frames, skipped := subscribeFrames(tt.ids)
			var all []string
			for _, b := range frames {
				if len(b) > 4096 {
					t.Errorf("frame of %d bytes", len(b))
				}
				var f struct {
					Type string
					Data subscribeData
				}
				if err := json.Unmarshal(b, &f); err != nil || f.Type != "subscribe" {
					t.Fatalf("frame %s: %v", b, err)
				}
				all = append(all, f.Data.ChannelIDs...)
			}
			if len(skipped) != tt.wantSkipped || len(all)+len(skipped) != len(tt.ids) {
				t.Errorf("subscribed %d and skipped %d of %d ids, want %d skipped", len(all), len(skipped), len(tt.ids), tt.wantSkipped)
			}
		})
	}
}

func TestReconnectsAfterTheGatewayDropsTheConnectionMidStream(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	sink := newSink()
	connected(ctx, t, f, c, sink)
	deliver(ctx, t, f, human("m-before", "one"))
	sink.wait(ctx, t, 1)

	f.DropConnections()
	// No resume in this protocol: a fresh ready, and every channel subscribed again.
	if err := f.WaitConnections(ctx, 2, channelID, "ch-random", dmID); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(ctx, t, c, "connected again", func(s connector.Status) bool {
		return s.State == connector.StateConnected && s.Reconnects == 1
	})
	if st.LastError != "" {
		t.Errorf("last error once connected again = %q, want it cleared", st.LastError)
	}
	deliver(ctx, t, f, human("m-after", "two"))
	if got := ids(sink.wait(ctx, t, 2)); strings.Join(got, ",") != "m-before,m-after" {
		t.Errorf("accepted %v, want m-before then m-after", got)
	}
}

func TestAMessageIntakeCouldNotStoreIsOfferedAgainAndRedeliveriesKeepTheirID(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	sink := newSink()
	sink.fail = func(call int, m connector.Message) error {
		if call == 1 {
			return errDiskFull
		}
		return nil
	}
	connected(ctx, t, f, c, sink)
	deliver(ctx, t, f, human("m-1", "store me"))

	// Not stored: the event does not count as handled, the connection is
	// dropped and the message offered again once connected again.
	if err := f.WaitClosed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got := sink.wait(ctx, t, 1)
	if got[0].ID != "m-1" {
		t.Fatalf("accepted %v, want m-1 offered again", ids(got))
	}
	st := c.Status()
	if st.Reconnects < 1 {
		t.Errorf("status %+v, want a reconnect after the refused Accept", st)
	}
	// The platform (or a user's retry) delivering it again hands the same ID
	// on: intake deduplicates on it.
	if err := f.WaitConnections(ctx, 2, channelID); err != nil {
		t.Fatal(err)
	}
	deliver(ctx, t, f, human("m-1", "store me"))
	got = sink.wait(ctx, t, 2)
	if got[1].ID != "m-1" {
		t.Errorf("redelivery accepted as %q, want the same id m-1", got[1].ID)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.overlap {
		t.Error("Accept was called again before an earlier Accept returned")
	}
}

func TestEventsAreHandedOnOneAtATimeInOrder(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	sink := newSink()
	release := make(chan struct{})
	sink.fail = func(call int, m connector.Message) error {
		if call == 1 {
			<-release
		}
		return nil
	}
	connected(ctx, t, f, c, sink)
	for i := range 5 {
		deliver(ctx, t, f, human(fmt.Sprint("m-", i), "x"))
	}
	close(release)
	got := ids(sink.wait(ctx, t, 5))
	if strings.Join(got, ",") != "m-0,m-1,m-2,m-3,m-4" {
		t.Errorf("accepted %v, want in delivery order", got)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.overlap {
		t.Error("a second Accept ran while the first had not returned")
	}
}

func TestASilentGatewayIsTakenAsDeadAfterSixtySeconds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	f.SetSilent(true)
	clock := clockwork.NewFakeClock()
	c, _ := newTestConnector(t, f, func(o *Options) {
		o.Clock = clock
		o.BackoffMin, o.BackoffMax = time.Second, time.Second
	})
	connected(ctx, t, f, c, newSink()) // the ready frame is the last the gateway sends

	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the heartbeat ticker
		t.Fatal(err)
	}
	// The fake clock sends every tick of an Advance under its lock, so the
	// watcher judges each tick at the clock's time after the Advance.
	clock.Advance(30 * time.Second)
	if _, err := f.WaitFrame(ctx, 1, "ping"); err != nil {
		t.Fatalf("after 30 s of silence the bot did not ping: %v", err)
	}
	clock.Advance(30 * time.Second)
	if err := f.WaitClosed(ctx, 1); err != nil {
		t.Fatalf("after 60 s of silence the connection was not dropped: %v", err)
	}
	st := waitStatus(ctx, t, c, "disconnected", func(s connector.Status) bool { return s.State == connector.StateDisconnected })
	if !strings.Contains(st.LastError, "no frame from the gateway for 1m0s") {
		t.Errorf("last error %q, want it to say the gateway was silent for 60 s", st.LastError)
	}
	f.SetSilent(false)
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the back-off timer
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := f.WaitConnections(ctx, 2, channelID); err != nil {
		t.Fatal(err)
	}
	waitStatus(ctx, t, c, "connected again", func(s connector.Status) bool {
		return s.State == connector.StateConnected && s.Reconnects == 1
	})
}

// A ready read within 30 s counts even when the bot is still busy with it
// (subscribing, logging) at the 30 s mark: the watcher used to learn of the
// ready only after all that, and dropped a connection that had become ready.
func TestAReadyStillBeingHandledAtThirtySecondsKeepsTheConnection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	f.SetSilent(true)
	clock := clockwork.NewFakeClock()
	hold := newHoldingHandler("meepachat gateway ready")
	c, _ := newTestConnector(t, f, func(o *Options) {
		o.Clock = clock
		o.Logger = slog.New(hold)
	})
	start(t, c, newSink())
	t.Cleanup(func() { close(hold.release) }) // before start's cleanup waits for Run
	select {
	case <-hold.reached: // ready read and subscribed; the session is held in its log line
	case <-ctx.Done():
		t.Fatal("the bot never logged that the gateway was ready")
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the watcher's ticker
		t.Fatal(err)
	}
	clock.Advance(30 * time.Second)

	// Either the watcher pings (it took the connection as ready and silent
	// for 30 s) or it drops the connection for want of a ready.
	pinged, dropped := make(chan error, 1), make(chan error, 1)
	go func() { _, err := f.WaitFrame(ctx, 1, "ping"); pinged <- err }()
	go func() { dropped <- f.WaitClosed(ctx, 1) }()
	select {
	case err := <-pinged:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-dropped:
		if err == nil {
			t.Fatal("the connection was dropped for want of a ready though its ready was read in time")
		}
		t.Fatal(err)
	}
}

func TestAGatewayThatSendsNoReadyIsDroppedAfterThirtySeconds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	f.WithholdReady(1)
	clock := clockwork.NewFakeClock()
	c, _ := newTestConnector(t, f, func(o *Options) {
		o.Clock = clock
		o.BackoffMin, o.BackoffMax = time.Second, time.Second
	})
	start(t, c, newSink())
	if err := f.WaitConnections(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Second)
	if err := f.WaitClosed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(ctx, t, c, "disconnected", func(s connector.Status) bool { return s.State == connector.StateDisconnected })
	if !strings.Contains(st.LastError, "no ready event") {
		t.Errorf("last error %q, want it to say no ready came", st.LastError)
	}
}

// The 30 s for ready count from the upgrade, not from whenever the watcher
// goroutine got to run.
func TestTheWaitForReadyCountsFromTheUpgradeNotFromAWatcherThatStartedLate(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	f.WithholdReady(1)
	clock := newLateTickerClock()
	c, _ := newTestConnector(t, f, func(o *Options) {
		o.Clock = clock
		o.BackoffMin, o.BackoffMax = time.Second, time.Second
	})
	start(t, c, newSink())
	if err := f.WaitConnections(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the watcher's ticker, not yet handed back
		t.Fatal(err)
	}
	clock.Advance(30 * time.Second)
	close(clock.release)
	if err := f.WaitClosed(ctx, 1); err != nil {
		t.Fatalf("30 s after the upgrade without a ready the connection was not dropped: %v", err)
	}
}

func TestGatewayPingsAreAnswered(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	connected(ctx, t, f, c, newSink())
	before := c.Status().LastEvent
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := f.Ping(pctx); err != nil {
		t.Fatalf("the gateway's ping was not answered: %v", err)
	}
	// A ping is a sign of life: it keeps the connection from being taken as dead.
	waitStatus(ctx, t, c, "the ping counted as an event", func(s connector.Status) bool { return s.LastEvent.After(before) })
}

func TestBadFramesAreLoggedAndHandNothingOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		frame   string
		wantLog string
	}{
		{"Not_JSON", `{"type": "message.created", "data": {`, "malformed frame"},
		{"A_JSON_array", `[1,2,3]`, "malformed frame"},
		{"No_type", `{"data": {"id": "m-x"}}`, "malformed frame"},
		{"A_message_that_is_a_string", `{"type": "message.created", "data": "m-x"}`, "malformed message.created"},
		{"A_message_without_an_id", `{"type": "message.created", "data": {"channelId": "ch-general", "content": "x"}}`, "malformed message.created"},
		{"An_unknown_event_type", `{"type": "voice.joined", "data": {"id": "m-x"}}`, "unknown event type"},
		{"A_malformed_channel_created", `{"type": "channel.created", "data": 7}`, "malformed channel.created"},
		{"A_message_without_text", `{"type": "message.created", "data": {"id": "m-x", "channelId": "ch-general", "userId": "u-alice", "content": "  "}}`, "without text"},
		{"A_pong", `{"type": "pong"}`, ""},
		{"An_ignored_edit", `{"type": "message.updated", "data": {"id": "m-x", "channelId": "ch-general", "content": "edited"}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			c, logs := newTestConnector(t, f, nil)
			sink := newSink()
			connected(ctx, t, f, c, sink)
			if err := f.SendRaw(ctx, []byte(tt.frame)); err != nil {
				t.Fatal(err)
			}
			deliver(ctx, t, f, human("m-marker", "after the bad frame"))
			if got := ids(sink.wait(ctx, t, 1)); strings.Join(got, ",") != "m-marker" {
				t.Errorf("accepted %v, want only the message after the bad frame", got)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("log does not say %q:\n%s", tt.wantLog, logs)
			}
			if n := f.Connections(); n != 1 {
				t.Errorf("%d connections, want the bad frame to keep the connection", n)
			}
		})
	}
}

func TestAnOversizedFrameIsRefusedAndTheConnectorRecovers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, logs := newTestConnector(t, f, func(o *Options) { o.MaxFrameBytes = 64 << 10 })
	sink := newSink()
	connected(ctx, t, f, c, sink)
	huge, _ := json.Marshal(human("m-huge", strings.Repeat("A", 100<<10)))
	if err := f.SendRaw(ctx, []byte(`{"type":"message.created","data":`+string(huge)+`}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitConnections(ctx, 2, channelID); err != nil {
		t.Fatal(err)
	}
	deliver(ctx, t, f, human("m-next", "fine"))
	if got := ids(sink.wait(ctx, t, 1)); strings.Join(got, ",") != "m-next" {
		t.Errorf("accepted %v, want only m-next", got)
	}
	if !strings.Contains(logs.String(), "over the size limit") {
		t.Errorf("log does not mention the oversized frame:\n%s", logs)
	}
}

func TestHandshakeFailuresAreReportedAndRetried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		setup       func(*meepachattest.Fake)
		wantErr     string
		wantWarning string
	}{
		{"A_refused_token_is_a_standing_warning", func(f *meepachattest.Fake) { f.FailHandshakes(401, 401) },
			"refused the bot token (HTTP 401)", "check the token"},
		{"A_server_error_is_retried", func(f *meepachattest.Fake) { f.FailHandshakes(503) }, "HTTP 503", ""},
		{"A_close_before_ready_is_retried", func(f *meepachattest.Fake) { f.CloseBeforeReady(1) }, "before ready", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			tt.setup(f)
			c, _ := newTestConnector(t, f, func(o *Options) { o.BackoffMin, o.BackoffMax = 20*time.Millisecond, 20*time.Millisecond })
			start(t, c, newSink())
			waitStatus(ctx, t, c, "the failure reported", func(s connector.Status) bool {
				return strings.Contains(s.LastError, tt.wantErr) && strings.Contains(s.Warning, tt.wantWarning)
			})
			st := waitStatus(ctx, t, c, "connected", func(s connector.Status) bool { return s.State == connector.StateConnected })
			if st.Warning != "" || st.LastError != "" || st.Reconnects < 1 {
				t.Errorf("status once connected = %+v, want warning and error cleared and a reconnect counted", st)
			}
		})
	}
}

func TestTypingIsSentOverTheGateway(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	if err := c.Typing(ctx, channelID, nil); err == nil {
		t.Error("Typing before the gateway is connected succeeded, want an error")
	}
	connected(ctx, t, f, c, newSink())
	if err := c.Typing(ctx, channelID, map[string]string{MetaServer: serverID}); err != nil {
		t.Fatal(err)
	}
	fr, err := f.WaitFrame(ctx, 1, "typing")
	if err != nil {
		t.Fatal(err)
	}
	if string(fr.Data) != `{"channelId":"ch-general"}` {
		t.Errorf("typing data %s, want the channel id", fr.Data)
	}
}

func TestReconnectDelaysGrowToTheCapWithJitter(t *testing.T) {
	t.Parallel()
	c, err := New("chat", Options{BaseURL: "http://127.0.0.1:1", Token: testToken, BackoffMin: time.Second, BackoffMax: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		failures int
		want     time.Duration
	}{{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {4, 8 * time.Second}, {10, 8 * time.Second}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("After_%d_failures_the_delay_is_at_most_%s", tt.failures, tt.want), func(t *testing.T) {
			t.Parallel()
			seen := map[time.Duration]bool{}
			for range 200 {
				d := c.backoff(tt.failures)
				if d > tt.want || d < tt.want*3/4 {
					t.Fatalf("delay %s, want within [%s, %s]", d, tt.want*3/4, tt.want)
				}
				seen[d] = true
			}
			if len(seen) < 2 {
				t.Errorf("200 delays were all %v: no jitter", seen)
			}
		})
	}
}
