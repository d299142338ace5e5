package slack

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

func TestSocketModeHandsAMessageToTheSinkAndAcksOnlyAfterAccept(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	var ackedDuringAccept atomic.Bool
	sink.accept = func(connector.Message) error {
		if len(fake.Acks()) > 0 {
			ackedDuringAccept.Store(true)
		}
		return nil
	}
	startSocket(t, fake, sink, nil)

	ev := mention(fake, "deploy the thing")
	id, err := fake.Deliver(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitAck(ctx, id); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 1)
	if ackedDuringAccept.Load() {
		t.Errorf("the envelope was acknowledged before Accept returned")
	}
	want := connector.Message{
		Connector:   "slack-test",
		ID:          "C0CHAN:" + ev.TS,
		Channel:     "C0CHAN",
		ChannelName: "general",
		Server:      fake.Options().TeamID,
		Thread:      ev.TS,
		Author:      "U0ALICE",
		Text:        "deploy the thing",
		Meta:        map[string]string{"channel_type": "channel"},
	}
	got := calls[0]
	if got.ID != want.ID || got.Channel != want.Channel || got.ChannelName != want.ChannelName || got.Server != want.Server || got.Thread != want.Thread ||
		got.Author != want.Author || got.Text != want.Text || got.Connector != want.Connector || got.Meta["channel_type"] != "channel" {
		t.Errorf("message = %+v, want %+v", got, want)
	}
}

func TestSocketModeKeepsOrIgnoresEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		edit   func(*Options)
		event  func(fake *slacktest.Server) slacktest.Event
		accept bool
		thread string // expected Thread when accepted; "" means the message ts
	}{
		{name: "A_mention_in_a_channel_is_handed_on", accept: true,
			event: func(f *slacktest.Server) slacktest.Event { return mention(f, "hi") }},
		{name: "A_reply_in_a_thread_keeps_the_thread", accept: true, thread: "1700000000.000100",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "more")
				ev.ThreadTS = "1700000000.000100"
				return ev
			}},
		{name: "An_app_mention_event_is_handed_on", accept: true,
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "hi")
				ev.Type, ev.ChannelType = "app_mention", ""
				return ev
			}},
		{name: "A_direct_message_without_mention_is_handed_on", accept: true,
			event: func(f *slacktest.Server) slacktest.Event {
				return slacktest.Event{Type: "message", Channel: "D0DM", ChannelType: "im", User: "U0ALICE", Text: "hello", TS: newTS()}
			}},
		{name: "A_channel_message_without_mention_is_ignored_with_trigger_mention",
			event: func(f *slacktest.Server) slacktest.Event {
				return slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "chatter", TS: newTS()}
			}},
		{name: "A_decision_on_an_approval_without_mention_is_handed_on_with_trigger_mention", accept: true,
			event: func(f *slacktest.Server) slacktest.Event {
				return slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "approve " + testApprovalID, TS: newTS()}
			}},
		{name: "A_channel_message_without_mention_is_handed_on_with_trigger_all", accept: true,
			edit: func(o *Options) { o.Trigger = TriggerAll },
			event: func(f *slacktest.Server) slacktest.Event {
				return slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: "chatter", TS: newTS()}
			}},
		{name: "The_bots_own_message_is_ignored", edit: func(o *Options) { o.Trigger = TriggerAll },
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "my own reply")
				ev.User, ev.BotID = f.Options().BotUserID, f.Options().BotID
				return ev
			}},
		{name: "The_bots_own_message_is_ignored_even_with_allow_bots",
			edit: func(o *Options) { o.Trigger, o.AllowBots = TriggerAll, true },
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "my own reply")
				ev.User, ev.BotID = f.Options().BotUserID, f.Options().BotID
				return ev
			}},
		{name: "Another_bots_message_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "beep")
				ev.User, ev.BotID = "U0OTHER", "B0OTHER"
				return ev
			}},
		{name: "A_bot_message_subtype_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "beep")
				ev.User, ev.BotID, ev.Subtype = "", "B0OTHER", "bot_message"
				return ev
			}},
		{name: "Another_bots_message_is_handed_on_with_allow_bots", accept: true,
			edit: func(o *Options) { o.AllowBots = true },
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "beep")
				ev.User, ev.BotID = "U0OTHER", "B0OTHER"
				return ev
			}},
		{name: "An_edited_message_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "edited")
				ev.Subtype = "message_changed"
				return ev
			}},
		{name: "A_deleted_message_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "")
				ev.Subtype = "message_deleted"
				return ev
			}},
		{name: "A_channel_join_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				ev := mention(f, "has joined")
				ev.Subtype = "channel_join"
				return ev
			}},
		{name: "An_unknown_event_type_is_ignored",
			event: func(f *slacktest.Server) slacktest.Event {
				return slacktest.Event{Type: "reaction_added", User: "U0ALICE", TS: newTS()}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			fake := slacktest.New(t, slacktest.Options{})
			sink := newSink()
			startSocket(t, fake, sink, tc.edit)
			ev := tc.event(fake)
			id, err := fake.Deliver(ctx, ev)
			if err != nil {
				t.Fatal(err)
			}
			// Handled or ignored, the envelope is acknowledged; a DM after
			// it shows, once it arrives, that the first one was decided.
			if err := fake.WaitAck(ctx, id); err != nil {
				t.Fatal(err)
			}
			sentinel := slacktest.Event{Type: "message", Channel: "D0DM", ChannelType: "im", User: "U0ALICE", Text: "sentinel", TS: newTS()}
			if _, err := fake.Deliver(ctx, sentinel); err != nil {
				t.Fatal(err)
			}
			want := 1
			if tc.accept {
				want = 2
			}
			calls := sink.wait(ctx, t, want)
			if len(calls) != want || calls[len(calls)-1].ID != "D0DM:"+sentinel.TS {
				t.Fatalf("sink got %+v, want %d messages ending with the sentinel", calls, want)
			}
			if !tc.accept {
				return
			}
			got := calls[0]
			if got.ID != ev.Channel+":"+ev.TS {
				t.Errorf("ID = %q, want %q", got.ID, ev.Channel+":"+ev.TS)
			}
			wantThread := tc.thread
			if wantThread == "" {
				wantThread = ev.TS
			}
			if got.Thread != wantThread {
				t.Errorf("Thread = %q, want %q", got.Thread, wantThread)
			}
		})
	}
}

func TestMessageAndAppMentionOfOneMessageCarryTheSameID(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	startSocket(t, fake, sink, nil)
	ev := mention(fake, "once please")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	ev.Type, ev.ChannelType = "app_mention", ""
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 2)
	if calls[0].ID != calls[1].ID {
		t.Errorf("message id %q and app_mention id %q differ: intake would run the message twice", calls[0].ID, calls[1].ID)
	}
}

func TestSocketModeReconnectsWithANewURLAfterTheSocketDrops(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	c, _ := startSocket(t, fake, sink, nil)
	if _, err := fake.Deliver(ctx, mention(fake, "before")); err != nil {
		t.Fatal(err)
	}
	sink.wait(ctx, t, 1)

	fake.Drop()
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}
	after := mention(fake, "after")
	if _, err := fake.Deliver(ctx, after); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 2)
	if calls[1].ID != "C0CHAN:"+after.TS {
		t.Errorf("after the reconnect the sink got %+v", calls[1])
	}
	if got := fake.Opens(); got != 2 {
		t.Errorf("apps.connections.open was called %d times, want 2 (a fresh URL per connection)", got)
	}
	st := c.Status()
	if st.State != connector.StateConnected || st.Reconnects != 1 || st.ConnectedSince.IsZero() || st.LastEvent.IsZero() {
		t.Errorf("status after one reconnect = %+v", st)
	}
}

func TestSocketModeReconnectsWhenSlackAsksToDisconnect(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	startSocket(t, fake, sink, nil)
	if err := fake.Disconnect("refresh_requested"); err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ev := mention(fake, "still here")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if calls := sink.wait(ctx, t, 1); calls[0].ID != "C0CHAN:"+ev.TS {
		t.Errorf("sink got %+v", calls)
	}
}

func TestARefreshOpensTheNewConnectionBeforeClosingTheOldAndLogsItAtInfo(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	c, logs := startSocket(t, fake, sink, nil)

	release := fake.HoldHandshakes()
	defer release()
	if err := fake.Disconnect("refresh_requested"); err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitHeldHandshake(ctx); err != nil {
		t.Fatal(err)
	}
	// The new connection is on its way: the old one still delivers.
	during := mention(fake, "during the refresh")
	id, err := fake.Deliver(ctx, during)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitAck(ctx, id); err != nil {
		t.Fatal(err)
	}
	release()
	if err := fake.WaitClosed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.Timeline(), []string{"open 1", "open 2", "close 1"}; !slices.Equal(got, want) {
		t.Errorf("connections = %v, want %v: the new one open before the old one closes", got, want)
	}
	after := mention(fake, "after the refresh")
	if _, err := fake.Deliver(ctx, after); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 2)
	if calls[0].ID != "C0CHAN:"+during.TS || calls[1].ID != "C0CHAN:"+after.TS {
		t.Errorf("sink got %+v, want the messages sent during and after the refresh", calls)
	}
	if st := c.Status(); st.State != connector.StateConnected || st.LastError != "" {
		t.Errorf("status after a refresh = %+v, want connected without an error", st)
	}
	log := logs.String()
	if strings.Contains(log, "level=WARN") || strings.Contains(log, "level=ERROR") {
		t.Errorf("a routine refresh logged a warning:\n%s", log)
	}
	if !strings.Contains(log, `level=INFO msg="Slack asked for a fresh Socket Mode connection`) {
		t.Errorf("the refresh is not logged at INFO:\n%s", log)
	}
}

func TestAnEnvelopeIntakeDidNotStoreIsNotAckedAndItsRedeliveryHasTheSameID(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	var calls atomic.Int32
	sink.accept = func(m connector.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("disk full")
		}
		return nil
	}
	c, _ := startSocket(t, fake, sink, nil)
	ev := mention(fake, "store me")
	first, err := fake.Deliver(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	// Envelopes are handled in order: once a later one is acknowledged the
	// first one's fate is decided.
	probe, err := fake.Deliver(ctx, slacktest.Event{Type: "reaction_added", User: "U0ALICE", TS: newTS()})
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitAck(ctx, probe); err != nil {
		t.Fatal(err)
	}
	if fake.Acked(first) {
		t.Fatalf("the envelope was acknowledged although Accept failed: Slack would not redeliver it")
	}
	if st := c.Status(); !strings.Contains(st.LastError, "disk full") {
		t.Errorf("Status().LastError = %q, want the failed hand-off", st.LastError)
	}
	second, err := fake.Redeliver(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitAck(ctx, second); err != nil {
		t.Fatal(err)
	}
	got := sink.wait(ctx, t, 2)
	if got[0].ID != got[1].ID || got[1].ID != "C0CHAN:"+ev.TS {
		t.Errorf("the redelivered event has id %q, the first %q: want the same", got[1].ID, got[0].ID)
	}
}

func TestAnEnvelopeInFlightWhenTheSocketDropsIsHandedOnAgainWhenRedelivered(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var n atomic.Int32
	sink.accept = func(connector.Message) error {
		if n.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
		return nil
	}
	startSocket(t, fake, sink, nil)
	ev := mention(fake, "in flight")
	first, err := fake.Deliver(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	fake.Drop() // the ack of the first delivery can no longer reach Slack
	close(release)
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if fake.Acked(first) {
		t.Fatal("the first delivery was acknowledged on a dropped socket")
	}
	again, err := fake.RedeliverUnacked(ctx)
	if err != nil || len(again) != 1 {
		t.Fatalf("RedeliverUnacked = %v, %v; want the one unacknowledged envelope", again, err)
	}
	if err := fake.WaitAck(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
	got := sink.wait(ctx, t, 2)
	if got[0].ID != got[1].ID {
		t.Errorf("ids %q and %q differ: intake could not deduplicate the redelivery", got[0].ID, got[1].ID)
	}
}

func TestGarbageFramesAreLoggedAcceptNothingAndCrashNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	_, logs := startSocket(t, fake, sink, nil)
	frames := []string{
		`not json at all`,
		`{"type":"events_api","envelope_id":"g1","payload":"a string"}`,
		`{"type":"events_api","envelope_id":"g2","payload":{"type":"event_callback"}}`,
		`{"type":"events_api","envelope_id":"g3","payload":{"type":"event_callback","event":{"type":"message","text":42}}}`,
		`{"type":"events_api","envelope_id":"g4","payload":{"type":"event_callback","event":{"type":"message","user":"U0ALICE","text":"no channel"}}}`,
		`{"type":"brand_new_type","envelope_id":"g5"}`,
		`{}`,
		`[1,2,3]`,
		"\xff\xfe\x00garbage",
	}
	for _, f := range frames {
		if err := fake.SendRaw(ctx, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	sentinel := mention(fake, "sentinel")
	if _, err := fake.Deliver(ctx, sentinel); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 1)
	if len(calls) != 1 || calls[0].ID != "C0CHAN:"+sentinel.TS {
		t.Errorf("sink got %+v, want only the sentinel", calls)
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("garbage left no warning in the log:\n%s", logs.String())
	}
}

func TestAnOversizedFrameDropsTheConnectionAndNothingIsAccepted(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	startSocket(t, fake, sink, func(o *Options) { o.MaxFrameBytes = 4096 })
	big := mention(fake, strings.Repeat("x", 10000))
	if _, err := fake.Deliver(ctx, big); err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}
	small := mention(fake, "small")
	if _, err := fake.Deliver(ctx, small); err != nil {
		t.Fatal(err)
	}
	if calls := sink.wait(ctx, t, 1); len(calls) != 1 || calls[0].ID != "C0CHAN:"+small.TS {
		t.Errorf("sink got %+v, want only the small message", calls)
	}
}

func TestAHandshakeClosedMidwayIsRetriedUntilItConnects(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	fake.BreakHandshakes(2)
	sink := newSink()
	c, _ := startSocket(t, fake, sink, nil)
	if got := fake.Opens(); got != 3 {
		t.Errorf("apps.connections.open called %d times, want 3 (two broken handshakes, one good)", got)
	}
	ev := mention(fake, "hello")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	sink.wait(ctx, t, 1)
	if st := c.Status(); st.State != connector.StateConnected || st.LastError != "" {
		t.Errorf("status after connecting = %+v", st)
	}
}

func TestARefusedAppTokenIsAStandingWarningWithoutTheToken(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	clock := clockwork.NewFakeClock()
	o, logs := socketOptions(t, fake)
	o.AppToken = "xapp-1-wrong-secret-value"
	o.Clock = clock
	c, err := New("slack-test", o)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, newSink())
	// Run waits on the clock before its next attempt: the failure is recorded.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	if st.State != connector.StateDisconnected || !strings.Contains(st.Warning, "app_token") || !strings.Contains(st.Warning, "invalid_auth") {
		t.Errorf("status = %+v, want disconnected with a warning about app_token", st)
	}
	for _, where := range []string{st.Warning, st.LastError, logs.String()} {
		if strings.Contains(where, o.AppToken) || strings.Contains(where, o.BotToken) {
			t.Errorf("a token leaked: %s", where)
		}
	}
	// The next attempt comes after the back-off.
	clock.Advance(o.BackoffMax)
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := fake.Opens(); got < 2 {
		t.Errorf("apps.connections.open called %d times after the back-off, want a second attempt", got)
	}
}

func TestBackoffGrowsWithJitterAndIsCapped(t *testing.T) {
	t.Parallel()
	c := &Connector{o: Options{BackoffMin: 100 * time.Millisecond, BackoffMax: 1600 * time.Millisecond}}
	for n := 1; n <= 10; n++ {
		ceiling := min(c.o.BackoffMin<<(n-1), c.o.BackoffMax)
		for range 20 {
			if d := c.backoff(n); d > ceiling || d < ceiling*3/4 {
				t.Fatalf("backoff(%d) = %s, want within [75%%, 100%%] of %s", n, d, ceiling)
			}
		}
	}
}

func TestAChannelWhoseNameSlackWillNotTellIsStillHandedOn(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	fake.SetChannelName("C0CHAN", "")
	sink := newSink()
	startSocket(t, fake, sink, nil)
	if _, err := fake.Deliver(ctx, mention(fake, "who am I")); err != nil {
		t.Fatal(err)
	}
	if calls := sink.wait(ctx, t, 1); calls[0].ChannelName != "" || calls[0].Channel != "C0CHAN" {
		t.Errorf("message = %+v, want channel C0CHAN without a name", calls[0])
	}
}

func TestAConnectorThatNeverConnectedCountsEachRetryAsAReconnect(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	clock := clockwork.NewFakeClock()
	o, _ := socketOptions(t, fake)
	o.AppToken = "xapp-1-wrong"
	o.Clock = clock
	c, err := New("slack-test", o)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, newSink())
	for range 4 {
		if err := clock.BlockUntilContext(ctx, 1); err != nil { // waiting to retry
			t.Fatal(err)
		}
		clock.Advance(o.BackoffMax)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	if st.Reconnects != 4 || fake.Opens() != 5 {
		t.Errorf("after 5 failed attempts: reconnects = %d (Slack saw %d opens), want 4 like every connector", st.Reconnects, fake.Opens())
	}
	if st.LastError == "" || st.LastErrorAt.IsZero() {
		t.Errorf("status = %+v, want the last error with its time", st)
	}
}

func TestARefreshWhoseOldConnectionSlackClosesFirstGoesOnWithTheNewOne(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	c, logs := startSocket(t, fake, sink, nil)
	release := fake.HoldHandshakes()
	defer release()
	if err := fake.Disconnect("refresh_requested"); err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitHeldHandshake(ctx); err != nil {
		t.Fatal(err)
	}
	fake.Drop() // Slack closes the old one before the new one is up
	if err := fake.WaitClosed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	release()
	ev := mention(fake, "after")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if calls := sink.wait(ctx, t, 1); calls[0].ID != "C0CHAN:"+ev.TS {
		t.Errorf("sink got %+v", calls)
	}
	if got := fake.Opens(); got != 2 {
		t.Errorf("apps.connections.open called %d times, want 2: the refresh's connection is used, no reconnect after it", got)
	}
	if st := c.Status(); st.State != connector.StateConnected || st.Reconnects != 0 {
		t.Errorf("status = %+v, want connected without a reconnect", st)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the refresh logged a warning:\n%s", logs.String())
	}
}
