package discord_test

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

func TestStatusCountsEveryAttemptAfterTheFirstAndClearsTheErrorOnceConnected(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	for range 3 {
		fake.BreakNextHandshake("close")
	}
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	eventually(t, "the connector to read READY", func() bool { return c.Status().State == connector.StateConnected })
	st := c.Status()
	if st.Reconnects != 3 {
		t.Errorf("Reconnects = %d after three failed attempts and a good one, want 3", st.Reconnects)
	}
	if st.LastError != "" || !st.LastErrorAt.IsZero() {
		t.Errorf("connected with LastError %q at %s, want it cleared", st.LastError, st.LastErrorAt)
	}
}

func TestAFailedReplyIsTheLastErrorWithItsTimeUntilAReplySucceeds(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	const gone = "700000000000000404"
	fake.Refuse(gone, discordtest.Refusal{Status: 403, Code: 50001, Message: "Missing Access"})
	c, _ := newConnector(t, fake, nil)
	if err := c.Send(context.Background(), connector.Reply{RunID: "run-1", MessageID: "1401", Channel: gone, Text: "x"}); err == nil {
		t.Fatal("Send to a refused channel succeeded")
	}
	if st := c.Status(); st.LastError == "" || st.LastErrorAt.IsZero() {
		t.Fatalf("after a refused reply: LastError %q at %s, want the refusal with its time", st.LastError, st.LastErrorAt)
	}
	if err := c.Send(context.Background(), connector.Reply{RunID: "run-2", MessageID: "1402", Channel: chanID, Text: "y"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if st := c.Status(); st.LastError != "" || !st.LastErrorAt.IsZero() {
		t.Errorf("after a reply that arrived: LastError %q at %s, want it cleared", st.LastError, st.LastErrorAt)
	}
}

func TestABotThatNeverConnectsShowsItsAttemptsAndTheErrorWithItsTime(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, func(o *discord.Options) { o.BotToken = "not-the-token" })
	run(t, c, newSink())
	eventually(t, "three failed attempts", func() bool { return c.Status().Reconnects >= 2 })
	st := c.Status()
	if st.State == connector.StateConnected || st.LastError == "" || st.LastErrorAt.IsZero() {
		t.Errorf("status = %+v, want not connected, with the last error and its time", st)
	}
}
