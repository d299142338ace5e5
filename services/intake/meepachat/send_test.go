package meepachat

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
)

func reply(text string) connector.Reply {
	return connector.Reply{RunID: "run-1", MessageID: "m-1", Channel: channelID, Thread: "m-root", Text: text,
		Meta: map[string]string{MetaServer: serverID}}
}

// longReplyWithCode is about 9,000 characters with a fenced block across the
// 4,000-character cuts.
func longReplyWithCode() string {
	var b strings.Builder
	b.WriteString("Here is the script you asked for.\n\n")
	b.WriteString("```python\n")
	for i := 0; utf8.RuneCountInString(b.String()) < 8900; i++ {
		b.WriteString("print('line number ")
		b.WriteString(strings.Repeat("é", i%7))
		b.WriteString("')  # some commentary to make the line longer\n")
	}
	b.WriteString("```\n\nRun it with python3.")
	return b.String()
}

func TestALongReplyArrivesAsFencedChunksInOrderInTheThread(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	text := longReplyWithCode()
	if n := utf8.RuneCountInString(text); n < 8500 {
		t.Fatalf("test reply is %d characters, want about 9,000", n)
	}
	if err := c.Send(ctx, reply(text)); err != nil {
		t.Fatal(err)
	}
	posted := f.Posted()
	if len(posted) < 3 {
		t.Fatalf("%d chunks posted, want at least 3", len(posted))
	}
	var joined strings.Builder
	for i, p := range posted {
		if n := utf8.RuneCountInString(p.Content); n > 4000 {
			t.Errorf("chunk %d is %d characters, over 4,000", i, n)
		}
		if p.ThreadID != "m-root" || p.ChannelID != channelID || p.ServerID != serverID || p.DM {
			t.Errorf("chunk %d went to %+v, want channel %s of server %s in thread m-root", i, p, channelID, serverID)
		}
		if fences := strings.Count(p.Content, "```"); fences%2 != 0 {
			t.Errorf("chunk %d leaves a code block open (%d fences):\n%s", i, fences, p.Content)
		}
		if i > 0 && !strings.HasPrefix(p.Content, "```python") {
			t.Errorf("chunk %d does not reopen the code block: %.40q", i, p.Content)
		}
		joined.WriteString(p.Content)
	}
	if !strings.HasPrefix(posted[0].Content, "Here is the script") || !strings.HasSuffix(posted[len(posted)-1].Content, "Run it with python3.") {
		t.Error("chunks are not in order")
	}
	stripped := strings.NewReplacer("```python", "", "```", "", "\n", "").Replace(joined.String())
	if want := strings.NewReplacer("```python", "", "```", "", "\n", "").Replace(text); stripped != want {
		t.Error("the chunks together do not hold the whole reply")
	}
}

func TestAReplyToADMGoesToTheDMEndpoint(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	r := connector.Reply{RunID: "run-2", MessageID: "m-3", Channel: dmID, Text: "hi", Meta: map[string]string{MetaDM: "true"}}
	if err := c.Send(ctx, r); err != nil {
		t.Fatal(err)
	}
	if p := f.Posted(); len(p) != 1 || !p[0].DM || p[0].ChannelID != dmID || p[0].ThreadID != "" {
		t.Errorf("posted %+v, want one DM in %s", p, dmID)
	}
}

func TestAShortRateLimitIsWaitedOutInsideSend(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	clock := clockwork.NewFakeClock()
	c, _ := newTestConnector(t, f, func(o *Options) { o.Clock = clock })
	f.RateLimit("2")
	done := make(chan error, 1)
	go func() { done <- c.Send(ctx, reply("rate limited once")) }()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if p := f.Posted(); len(p) != 0 {
		t.Fatalf("posted %+v while rate limited", p)
	}
	clock.Advance(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Send after waiting out Retry-After: %v", err)
	}
	if p := f.Posted(); len(p) != 1 || p[0].Content != "rate limited once" {
		t.Errorf("posted %+v, want the reply once", p)
	}
}

func TestALongRateLimitGoesBackToIntakeAndLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	text := longReplyWithCode()
	f.RateLimitAt(2, "120")

	err := c.Send(ctx, reply(text))
	after, ok := connector.RetryAfter(err)
	if !ok || after != 120*time.Second {
		t.Fatalf("Send = %v, want a RetryAfterError of 2m0s", err)
	}
	if p := f.Posted(); len(p) != 1 {
		t.Fatalf("%d chunks posted before the rate limit, want 1", len(p))
	}
	// Intake retries the same reply later: nothing is posted twice, nothing lost.
	if err := c.Send(ctx, reply(text)); err != nil {
		t.Fatal(err)
	}
	posted := f.Posted()
	want := connector.Split(text, 4000)
	if len(posted) != len(want) {
		t.Fatalf("%d chunks posted in all, want %d", len(posted), len(want))
	}
	for i := range want {
		if posted[i].Content != want[i] {
			t.Errorf("chunk %d differs from what was split", i)
		}
	}
}

func TestRefusalsThatWillNotChangeArePermanent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		setup     func(*meepachattest.Fake)
		r         connector.Reply
		permanent bool
		reason    string
	}{
		{"A_channel_that_is_gone", func(f *meepachattest.Fake) { f.Refuse(channelID, 404) }, reply("x"), true, "channel not found"},
		{"A_bot_removed_from_the_channel", func(f *meepachattest.Fake) { f.Refuse(channelID, 403) }, reply("x"), true, "not a member"},
		{"A_server_the_bot_is_not_in", nil,
			connector.Reply{Channel: channelID, Text: "x", Meta: map[string]string{MetaServer: "srv-unknown"}}, true, "HTTP 404"},
		{"A_reply_without_a_channel", nil, connector.Reply{Text: "x"}, true, "no MeepaChat channel"},
		{"A_refused_token_is_not_permanent", nil, reply("x"), false, "HTTP 401"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			f := newFake(t, testOptions())
			if tt.setup != nil {
				tt.setup(f)
			}
			c, _ := newTestConnector(t, f, func(o *Options) {
				if !tt.permanent {
					o.Token = testBotID + ".wrong-secret"
				}
			})
			err := c.Send(ctx, tt.r)
			if err == nil {
				t.Fatal("Send succeeded, want a refusal")
			}
			if connector.IsPermanent(err) != tt.permanent {
				t.Errorf("Send = %v, permanent %v, want %v", err, connector.IsPermanent(err), tt.permanent)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("Send = %v, want the reason %q", err, tt.reason)
			}
			var pe *connector.PermanentError
			if errors.As(err, &pe) && pe.Reason == "" {
				t.Error("a permanent error without a reason")
			}
			if len(f.Posted()) != 0 {
				t.Error("something was posted")
			}
		})
	}
}

func TestAFailedReplyIsTheLastErrorWithItsTimeUntilALaterReplyIsPosted(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	connected(ctx, t, f, c, newSink())
	f.RateLimit("600") // longer than Send waits out itself
	if err := c.Send(ctx, reply("limited")); err == nil {
		t.Fatal("Send succeeded through a long rate limit")
	}
	if st := c.Status(); !strings.Contains(st.LastError, "rate limit") || st.LastErrorAt.IsZero() {
		t.Fatalf("status after a failed reply = %+v, want the error and its time", st)
	}
	if err := c.Send(ctx, reply("fine")); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.LastError != "" || !st.LastErrorAt.IsZero() {
		t.Errorf("status after a later reply was posted = %+v, want the error cleared", st)
	}
}
