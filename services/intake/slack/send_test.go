package slack

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

func newSender(t *testing.T, fake *slacktest.Server, edit func(*Options)) (*Connector, *logBuffer) {
	t.Helper()
	o, logs := socketOptions(t, fake)
	if edit != nil {
		edit(&o)
	}
	c, err := New("slack-test", o)
	if err != nil {
		t.Fatal(err)
	}
	return c, logs
}

// longReply is about 9,000 characters with a fenced code block in the
// middle that no single chunk can hold.
func longReply() string {
	var b strings.Builder
	for i := 0; b.Len() < 3000; i++ {
		b.WriteString("Here is what I found in the logs, line by line. ")
	}
	b.WriteString("\n\n```go\n")
	for i := 0; b.Len() < 7500; i++ {
		b.WriteString("fmt.Println(\"a line of the listing\") // ü\n")
	}
	b.WriteString("```\n\n")
	for b.Len() < 9000 {
		b.WriteString("And that is the end of it. ")
	}
	return b.String()
}

func TestALongReplyArrivesAsFencedChunksInOrderInTheThread(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	text := longReply()
	r := connector.Reply{RunID: "run-1", MessageID: "C0CHAN:1.0001", Channel: "C0CHAN", Thread: "1767326125.000100", Text: text}
	if err := c.Send(ctx, r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	want := connector.Split(text, MessageLimit)
	if len(posts) != len(want) || len(posts) < 3 {
		t.Fatalf("%d posts, want %d (at least 3)", len(posts), len(want))
	}
	for i, p := range posts {
		if n := utf8.RuneCountInString(p.Text); n > MessageLimit {
			t.Errorf("post %d has %d characters, over Slack's %d", i, n, MessageLimit)
		}
		if p.Text != want[i] {
			t.Errorf("post %d is not chunk %d: the chunks arrived out of order", i, i)
		}
		if p.Channel != "C0CHAN" || p.ThreadTS != r.Thread {
			t.Errorf("post %d went to %s thread %q, want C0CHAN thread %q", i, p.Channel, p.ThreadTS, r.Thread)
		}
		if fences := strings.Count(p.Text, "```"); fences%2 != 0 {
			t.Errorf("post %d leaves a code block open (%d fences):\n%s", i, fences, p.Text)
		}
	}
	if !strings.Contains(posts[1].Text, "```go\n") {
		t.Errorf("the code block is not reopened with its language in the middle chunk")
	}
}

func TestAShortRateLimitIsWaitedOutAndLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	clock := clockwork.NewFakeClock()
	c, _ := newSender(t, fake, func(o *Options) { o.Clock = clock; o.MaxInlineWait = 5 * time.Second })
	fake.RateLimit(2 * time.Second)
	done := make(chan error, 1)
	go func() {
		done <- c.Send(ctx, connector.Reply{RunID: "run-1", MessageID: "m", Channel: "C0CHAN", Thread: "1.1", Text: "hello"})
	}()
	// Send waits on the clock for Retry-After.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := len(fake.Posts()); n != 0 {
		t.Fatalf("%d posts before the wait ended", n)
	}
	clock.Advance(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Send: %v", err)
	}
	if posts := fake.Posts(); len(posts) != 1 || posts[0].Text != "hello" {
		t.Errorf("posts = %+v, want the reply once", posts)
	}
}

func TestALongRateLimitIsHandedToIntakeAndTheRetryPostsOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	text := longReply()
	r := connector.Reply{RunID: "run-2", MessageID: "C0CHAN:1.0002", Channel: "C0CHAN", Thread: "1.2", Text: text}
	chunks := connector.Split(text, MessageLimit)

	// The first chunk goes out, then Slack asks to wait two minutes.
	fake.RateLimitAfter(1, 120*time.Second)
	err := c.Send(ctx, r)
	after, ok := connector.RetryAfter(err)
	if !ok || after != 120*time.Second {
		t.Fatalf("Send = %v, want a RetryAfterError of 2m0s", err)
	}
	if n := len(fake.Posts()); n != 1 {
		t.Fatalf("%d posts before the rate limit, want 1", n)
	}
	// Intake sends the reply again later: the rest arrives, nothing twice.
	if err := c.Send(ctx, r); err != nil {
		t.Fatalf("Send again: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != len(chunks) {
		t.Fatalf("%d posts in all, want %d chunks once each", len(posts), len(chunks))
	}
	for i, p := range posts {
		if p.Text != chunks[i] {
			t.Errorf("post %d is not chunk %d", i, i)
		}
	}
}

func TestRefusalsThatWillNotChangeArePermanentErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code      string
		permanent bool
	}{
		{"channel_not_found", true},
		{"not_in_channel", true},
		{"is_archived", true},
		{"account_inactive", true},
		{"invalid_auth", true},
		{"internal_error", false},
		{"fatal_error", false},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			fake := slacktest.New(t, slacktest.Options{})
			c, _ := newSender(t, fake, nil)
			fake.Refuse("C0GONE", tc.code)
			err := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m", Channel: "C0GONE", Thread: "1.1", Text: "hi"})
			if err == nil {
				t.Fatal("Send succeeded on a refused channel")
			}
			if got := connector.IsPermanent(err); got != tc.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, got, tc.permanent)
			}
			if !strings.Contains(err.Error(), tc.code) {
				t.Errorf("error %q does not carry Slack's reason %q", err, tc.code)
			}
			if _, ok := connector.RetryAfter(err); ok {
				t.Errorf("a refusal is not a rate limit: %v", err)
			}
		})
	}
}

func TestAWrongBotTokenIsAPermanentRefusal(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, logs := newSender(t, fake, func(o *Options) { o.BotToken = "xoxb-not-the-right-one" })
	err := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m", Channel: "C0CHAN", Text: "hi"})
	if !connector.IsPermanent(err) || !strings.Contains(err.Error(), "invalid_auth") {
		t.Fatalf("Send = %v, want a permanent invalid_auth", err)
	}
	if strings.Contains(err.Error(), "xoxb-not-the-right-one") || strings.Contains(logs.String(), "xoxb-not-the-right-one") {
		t.Errorf("the bot token leaked into the error or the log")
	}
}

func TestAFailedReplyIsTheLastErrorWithItsTimeUntilALaterReplyIsPosted(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	fake.RateLimit(time.Minute) // longer than Send waits out itself
	r := connector.Reply{RunID: "run-1", MessageID: "C0CHAN:1.0001", Channel: "C0CHAN", Thread: "1767326125.000100", Text: "hi"}
	if err := c.Send(ctx, r); err == nil {
		t.Fatal("Send succeeded through a long rate limit")
	}
	if st := c.Status(); !strings.Contains(st.LastError, "rate") || st.LastErrorAt.IsZero() {
		t.Fatalf("status after a failed reply = %+v, want the error and its time", st)
	}
	if err := c.Send(ctx, r); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.LastError != "" || !st.LastErrorAt.IsZero() {
		t.Errorf("status after a later reply was posted = %+v, want the error cleared", st)
	}
}

func TestARetryAfterACrashPostsOnlyWhatTheThreadDoesNotHaveYet(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	long := longReply()
	chunks := connector.Split(long, MessageLimit)
	tests := []struct {
		name string
		// before is what the attempt before the crash posted.
		before    func(t *testing.T, fake *slacktest.Server, c *Connector, r connector.Reply)
		wantPosts int // in all, after the retry
	}{
		{"A_reply_posted_before_the_crash_is_not_posted_again", func(t *testing.T, _ *slacktest.Server, c *Connector, r connector.Reply) {
			if err := c.Send(ctx, r); err != nil {
				t.Fatal(err)
			}
		}, len(chunks)},
		{"A_reply_cut_short_by_the_crash_gets_its_missing_chunks", func(t *testing.T, fake *slacktest.Server, c *Connector, r connector.Reply) {
			fake.RateLimitAfter(1, 120*time.Second)
			if err := c.Send(ctx, r); err == nil {
				t.Fatal("Send went through the rate limit")
			}
		}, len(chunks)},
		{"A_reply_never_posted_is_posted", func(*testing.T, *slacktest.Server, *Connector, connector.Reply) {}, len(chunks)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := slacktest.New(t, slacktest.Options{})
			thread := mention(fake, "write me a long one")
			fake.Callback(thread) // the message is in the channel's history
			r := connector.Reply{RunID: "run-7", MessageID: "C0CHAN:" + thread.TS, Channel: "C0CHAN", Thread: thread.TS, Text: long}
			before, _ := newSender(t, fake, nil)
			tc.before(t, fake, before, r)

			// The crash: a new process knows nothing of what was posted.
			after, _ := newSender(t, fake, nil)
			r.Retry = true
			if err := after.Send(ctx, r); err != nil {
				t.Fatalf("Send after the crash: %v", err)
			}
			posts := fake.Posts()
			if len(posts) != tc.wantPosts {
				t.Fatalf("%d posts in all, want each of the %d chunks once", len(posts), len(chunks))
			}
			for i, p := range posts {
				if p.Text != chunks[i] || p.ThreadTS != thread.TS {
					t.Errorf("post %d is not chunk %d in the thread", i+1, i+1)
				}
				if p.Metadata == nil || p.Metadata.EventType != ReplyEventType || p.Metadata.EventPayload["run_id"] != "run-7" {
					t.Errorf("post %d carries metadata %+v, want %s with the run id", i+1, p.Metadata, ReplyEventType)
				}
			}
			if fake.HistoryReads() == 0 {
				t.Error("the retry did not look at the thread")
			}
		})
	}
}
