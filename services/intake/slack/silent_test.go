package slack

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// A Socket Mode connection that stops carrying Slack's WebSocket pings (a
// half-open TCP connection, say) is taken as dead after PingInterval
// without one and replaced, and the status says why.
func TestASilentSocketIsTakenAsDeadAndReplaced(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{PingEvery: 10 * time.Millisecond})
	clock := clockwork.NewFakeClock()
	sink := newSink()
	c, _ := startSocket(t, fake, sink, func(o *Options) {
		o.Clock = clock
		o.PingInterval = 30 * time.Second
	})
	fake.SetSilent(true)
	// The connection is up once its ping watch (the clock's one ticker) is.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The tick at 30 s finds 30 s of silence, which is allowed; the one at
	// 60 s finds more and drops the connection.
	clock.Advance(31 * time.Second)
	clock.Advance(30 * time.Second)
	fake.SetSilent(false)
	for fake.Connections() < 2 {
		clock.Advance(time.Second) // the back-off before the new connection
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_ = fake.WaitConnections(wctx, 2)
		cancel()
		if ctx.Err() != nil {
			t.Fatalf("no new Socket Mode connection after the old one went silent; status %+v", c.Status())
		}
	}
	if err := fake.WaitClosed(ctx, 1); err != nil {
		t.Fatalf("the silent connection was not closed: %v", err)
	}
	st := c.Status()
	if !strings.Contains(st.LastError, "no WebSocket ping from Slack") || st.Reconnects != 1 {
		t.Errorf("status after a silent socket = %+v, want one reconnect and the silence as the last error", st)
	}
	ev := mention(fake, "after the silence")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if calls := sink.wait(ctx, t, 1); calls[0].ID != "C0CHAN:"+ev.TS {
		t.Errorf("after the reconnect the sink got %+v", calls[0])
	}
}
