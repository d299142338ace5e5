package discord_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// schedulerRunID has the form of the scheduler's run ids (36 characters,
// over Discord's 25 for a nonce).
const schedulerRunID = "20261202T003450_123456789_0a1b2c3d4e"

func TestAReplyPostedAgainByARestartedConnectorLeavesOneMessagePerChunk(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	reply := connector.Reply{RunID: schedulerRunID, MessageID: "1301", Channel: chanID,
		Text: strings.Repeat("a long answer. ", 300)} // three chunks
	first, _ := newConnector(t, fake, nil)
	if err := first.Send(context.Background(), reply); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posted := len(fake.Posts())
	if posted < 2 {
		t.Fatalf("%d posts, want a reply of several chunks", posted)
	}
	// A crash before the reply was marked delivered: a new process, which
	// remembers nothing, sends it all again.
	again, _ := newConnector(t, fake, nil)
	if err := again.Send(context.Background(), reply); err != nil {
		t.Fatalf("Send after the restart: %v", err)
	}
	if got := fake.PostRequests(); got != 2*posted {
		t.Fatalf("%d POSTs, want %d (every chunk twice)", got, 2*posted)
	}
	posts := fake.Posts()
	if len(posts) != posted {
		t.Fatalf("%d messages on Discord, want %d: the repeated chunks were posted again", len(posts), posted)
	}
	seen := map[string]bool{}
	for i, p := range posts {
		if !p.EnforceNonce || p.Nonce == "" || len(p.Nonce) > 25 {
			t.Errorf("chunk %d: nonce %q, enforce_nonce %t; want a nonce of at most 25 characters, enforced", i, p.Nonce, p.EnforceNonce)
		}
		if seen[p.Nonce] {
			t.Errorf("chunk %d shares nonce %q with an earlier chunk", i, p.Nonce)
		}
		seen[p.Nonce] = true
	}
}

func TestAShortRunIDIsTheNonceOfTheFirstChunk(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	if err := c.Send(context.Background(), connector.Reply{RunID: "run-7", MessageID: "1302", Channel: chanID, Text: "hi"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if p := fake.WaitPosts(t, 1)[0]; p.Nonce != "run-7" || !p.EnforceNonce {
		t.Errorf("nonce %q (enforced %t), want the run id run-7, enforced", p.Nonce, p.EnforceNonce)
	}
}

func TestAPostWhoseAnswerIsLostIsNotRepeatedBySend(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	reply := connector.Reply{RunID: schedulerRunID, MessageID: "1303", Channel: chanID, Text: "exactly once"}
	fake.LoseNextResponses(1)
	if err := c.Send(context.Background(), reply); err == nil || connector.IsPermanent(err) {
		t.Fatalf("Send with the answer lost = %v, want a transient error", err)
	}
	if err := c.Send(context.Background(), reply); err != nil {
		t.Fatalf("Send again: %v", err)
	}
	if posts := fake.Posts(); len(posts) != 1 {
		t.Errorf("%d messages after the retry, want 1: %+v", len(posts), posts)
	}
}

func TestBaseURLTakesTheHostOrTheAPIRoot(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	for _, base := range []string{fake.URL, fake.URL + "/", fake.URL + "/api", fake.URL + "/api/v10", fake.URL + "/api/v10/"} {
		t.Run(strings.TrimPrefix(base, fake.URL), func(t *testing.T) {
			c, _ := newConnector(t, fake, func(o *discord.Options) { o.BaseURL = base })
			before := len(fake.Posts())
			if err := c.Send(context.Background(), connector.Reply{MessageID: "1304", Channel: chanID, Text: "via " + base}); err != nil {
				t.Fatalf("Send with base_url %q: %v", base, err)
			}
			if posts := fake.Posts(); len(posts) != before+1 || posts[len(posts)-1].Content != "via "+base {
				t.Errorf("base_url %q: the reply did not arrive", base)
			}
		})
	}
}

func TestBaseURLWithAnotherAPIVersionIsRefused(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"https://discord.com/api/v9", "https://discord.com/api/v9/", "https://discord.com/api/v10?x=1"} {
		_, err := discord.New("d", discord.Options{BotToken: "t", BaseURL: base})
		if err == nil || !strings.Contains(err.Error(), "base_url") {
			t.Errorf("New with base_url %q = %v, want an error about base_url", base, err)
		}
	}
}
