package discord_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// longReplyWithCode is about 9,000 characters: prose, a long fenced Go
// block, more prose.
func longReplyWithCode() string {
	var b strings.Builder
	b.WriteString("Here is the fix, explained step by step.\n\n")
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, "Paragraph %d: the scheduler keeps one queue per agent and drains it in order.\n", i)
	}
	b.WriteString("\n```go\n")
	for i := 0; b.Len() < 7500; i++ {
		fmt.Fprintf(&b, "\tresult%03d := compute(ctx, input[%d]) // step %d of the pipeline\n", i, i, i)
	}
	b.WriteString("```\n\n")
	for b.Len() < 9000 {
		b.WriteString("That is all; run the tests again and they pass.\n")
	}
	return b.String()
}

func TestALongReplyArrivesAsFencedChunksInOrderInTheThread(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	text := longReplyWithCode()
	if n := utf8.RuneCountInString(text); n < 9000 {
		t.Fatalf("test reply has %d characters, want about 9,000", n)
	}
	const thread = "800000000000000002"
	err := c.Send(context.Background(), connector.Reply{RunID: "run-1", MessageID: "1201", Channel: chanID, Thread: thread, Text: text})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) < 5 {
		t.Fatalf("%d posts, want at least 5 for 9,000 characters", len(posts))
	}
	var lines []string
	for i, p := range posts {
		if p.Channel != thread {
			t.Errorf("chunk %d went to %q, want the thread %s", i, p.Channel, thread)
		}
		if n := utf8.RuneCountInString(p.Content); n > discord.MessageLimit {
			t.Errorf("chunk %d has %d characters, over Discord's %d", i, n, discord.MessageLimit)
		}
		if (i == 0) != (p.ReplyTo == "1201") {
			t.Errorf("chunk %d replies to %q; only the first should reference the message", i, p.ReplyTo)
		}
		if string(p.Mentions) != `{"parse":[]}` {
			t.Errorf("chunk %d allowed_mentions = %s, want none parsed", i, p.Mentions)
		}
		fences := 0
		for _, l := range strings.Split(p.Content, "\n") {
			if strings.HasPrefix(l, "```") {
				fences++
				continue
			}
			lines = append(lines, l)
		}
		if fences%2 != 0 {
			t.Errorf("chunk %d leaves a code fence open:\n%s", i, p.Content)
		}
	}
	var want []string
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if !strings.HasPrefix(l, "```") {
			want = append(want, l)
		}
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the chunks do not add up to the reply in order")
	}
}

func TestAShortRateLimitIsWaitedOutAndLosesNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit discordtest.Limit
		wait  time.Duration
	}{
		{"A_429_with_Retry_After", discordtest.Limit{RetryAfter: 2}, 2 * time.Second},
		{"A_global_429", discordtest.Limit{RetryAfter: 1.5, Global: true}, 2 * time.Second},
		{"An_exhausted_bucket_waits_for_its_reset", discordtest.Limit{Exhaust: true, ResetAfter: 3}, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			clock := clockwork.NewFakeClock()
			c, _ := newConnector(t, fake, func(o *discord.Options) { o.Clock = clock })
			fake.RateLimitNext(tt.limit)
			text := strings.Repeat("word ", 500) // two chunks
			done := make(chan error, 1)
			go func() {
				done <- c.Send(context.Background(), connector.Reply{RunID: "r", MessageID: "1301", Channel: chanID, Text: text})
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatalf("Send did not wait on the clock: %v", err)
			}
			clock.Advance(tt.wait)
			if err := <-done; err != nil {
				t.Fatalf("Send: %v", err)
			}
			posts := fake.Posts()
			if len(posts) != 2 {
				t.Fatalf("%d posts, want both chunks once each", len(posts))
			}
			if words := len(strings.Fields(posts[0].Content + " " + posts[1].Content)); words != 500 {
				t.Errorf("the chunks hold %d words, want 500", words)
			}
		})
	}
}

func TestALongRateLimitReturnsRetryAfterAndTheRetrySendsOnlyWhatIsLeft(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	clock := clockwork.NewFakeClock()
	c, _ := newConnector(t, fake, func(o *discord.Options) { o.Clock = clock })
	reply := connector.Reply{RunID: "r", MessageID: "1401", Channel: chanID, Text: strings.Repeat("a", 1990) + "\n" + strings.Repeat("b", 1990) + "\n" + strings.Repeat("c", 1990)}

	// The first chunk passes, the second meets the global limit for a minute.
	fake.RateLimitNext(discordtest.Limit{Exhaust: true, ResetAfter: 0}, discordtest.Limit{RetryAfter: 60, Global: true})
	err := c.Send(context.Background(), reply)
	after, ok := connector.RetryAfter(err)
	if !ok || after < 59*time.Second || after > 61*time.Second {
		t.Fatalf("Send = %v, want a RetryAfterError of about 60s", err)
	}
	if connector.IsPermanent(err) {
		t.Fatal("a rate limit is not a permanent refusal")
	}
	// The global limit holds every route, without asking Discord again.
	other := connector.Reply{RunID: "r2", MessageID: "1402", Channel: "700000000000000077", Text: "elsewhere"}
	if _, ok := connector.RetryAfter(c.Send(context.Background(), other)); !ok {
		t.Error("a send to another channel went out during a global rate limit")
	}
	if n := len(fake.Posts()); n != 1 {
		t.Fatalf("%d posts during the rate limit, want 1", n)
	}

	clock.Advance(time.Minute)
	if err := c.Send(context.Background(), reply); err != nil {
		t.Fatalf("Send after the wait: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 3 || posts[0].Content[0] != 'a' || posts[1].Content[0] != 'b' || posts[2].Content[0] != 'c' {
		var firsts []string
		for _, p := range posts {
			firsts = append(firsts, p.Content[:1])
		}
		t.Fatalf("posts start with %v, want a, b, c: each chunk once, in order", firsts)
	}
}

func TestRefusalsThatWillNotChangeArePermanent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		refusal   discordtest.Refusal
		permanent bool
		reason    string
	}{
		{"An_unknown_channel_is_permanent", discordtest.Refusal{Status: 404, Code: 10003, Message: "Unknown Channel"}, true, "Unknown Channel (code 10003)"},
		{"Missing_access_after_the_bot_was_removed_is_permanent", discordtest.Refusal{Status: 403, Code: 50001, Message: "Missing Access"}, true, "403 Forbidden: Missing Access"},
		{"A_server_error_is_transient", discordtest.Refusal{Status: 502, Message: "Bad Gateway"}, false, "502"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, nil)
			fake.Refuse(chanID, tt.refusal)
			err := c.Send(context.Background(), connector.Reply{RunID: "r", MessageID: "1501", Channel: chanID, Text: "hello"})
			if err == nil {
				t.Fatal("Send succeeded against a refusing channel")
			}
			if connector.IsPermanent(err) != tt.permanent {
				t.Errorf("IsPermanent(%v) = %t, want %t", err, !tt.permanent, tt.permanent)
			}
			if _, ok := connector.RetryAfter(err); ok {
				t.Errorf("a refusal came back as a rate limit: %v", err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not give Discord's reason %q", err, tt.reason)
			}
		})
	}
	t.Run("A_bot_token_Discord_rejects_is_permanent", func(t *testing.T) {
		t.Parallel()
		fake := discordtest.New(t)
		c, _ := newConnector(t, fake, func(o *discord.Options) { o.BotToken = "revoked" })
		err := c.Send(context.Background(), connector.Reply{RunID: "r", MessageID: "1502", Channel: chanID, Text: "hello"})
		if !connector.IsPermanent(err) || !strings.Contains(err.Error(), "401") {
			t.Errorf("Send with a revoked token = %v, want a permanent 401", err)
		}
	})
}

func TestTheBaseURLMayNameTheAPIPathOrNot(t *testing.T) {
	t.Parallel()
	for _, suffix := range []string{"", "/", "/api/v10", "/api/v10/"} {
		t.Run("Base_URL_ending_"+strings.ReplaceAll(suffix, "/", "_"), func(t *testing.T) {
			t.Parallel()
			fake := discordtest.New(t)
			c, _ := newConnector(t, fake, func(o *discord.Options) { o.BaseURL = fake.URL + suffix })
			if err := c.Send(context.Background(), connector.Reply{RunID: "r", MessageID: "2201", Channel: chanID, Text: "hi"}); err != nil {
				t.Fatalf("Send with base_url %q: %v", fake.URL+suffix, err)
			}
		})
	}
}
