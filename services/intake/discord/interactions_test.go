package discord_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

func hexKey(f *discordtest.Server) string { return hex.EncodeToString(f.PublicKey) }

// serve posts req to the connector's Interactions handler.
func serve(h http.Handler, req *http.Request) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, strings.TrimSpace(string(body))
}

func TestInteractionSignatures(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, nil)
	sink := newSink()
	h := c.Handler(sink)
	command, _ := fake.Command(discordtest.CommandSpec{ID: "1601", Channel: chanID, Guild: guild, User: alice, Name: "ask", Options: map[string]string{"question": "why"}})
	signed := func(body []byte) *http.Request { return fake.SignedRequest("/hooks/discord-main", body) }
	other := discordtest.New(t) // another application's key

	tests := []struct {
		name   string
		req    func() *http.Request
		status int
	}{
		{"A_signed_PING_gets_PONG", func() *http.Request { return signed(fake.Ping()) }, 200},
		{"A_tampered_body_is_refused", func() *http.Request {
			r := signed(command)
			r.Body = io.NopCloser(bytes.NewReader(bytes.Replace(command, []byte("why"), []byte("how"), 1)))
			return r
		}, 401},
		{"A_changed_timestamp_is_refused", func() *http.Request {
			r := signed(command)
			r.Header.Set("X-Signature-Timestamp", "1")
			return r
		}, 401},
		{"A_signature_that_is_not_hex_is_refused", func() *http.Request {
			r := signed(command)
			r.Header.Set("X-Signature-Ed25519", strings.Repeat("zz", 64))
			return r
		}, 401},
		{"A_short_signature_is_refused", func() *http.Request {
			r := signed(command)
			r.Header.Set("X-Signature-Ed25519", r.Header.Get("X-Signature-Ed25519")[:64])
			return r
		}, 401},
		{"A_missing_signature_is_refused", func() *http.Request {
			r := signed(command)
			r.Header.Del("X-Signature-Ed25519")
			return r
		}, 401},
		{"A_missing_timestamp_is_refused", func() *http.Request {
			r := signed(command)
			r.Header.Del("X-Signature-Timestamp")
			return r
		}, 401},
		{"A_signature_by_another_key_is_refused", func() *http.Request { return other.SignedRequest("/hooks/discord-main", command) }, 401},
		{"A_GET_is_not_allowed", func() *http.Request { return httptest.NewRequest(http.MethodGet, "/hooks/discord-main", nil) }, 405},
		{"Signed_malformed_JSON_is_a_bad_request", func() *http.Request { return signed([]byte("{not json")) }, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := serve(h, tt.req())
			if status != tt.status {
				t.Fatalf("status = %d (%s), want %d", status, body, tt.status)
			}
			if tt.status == 200 && body != `{"type":1}` {
				t.Errorf("PING answered %s, want {\"type\":1}", body)
			}
		})
	}
	if calls := sink.acceptCalls(); len(calls) != 0 {
		t.Errorf("refused interactions reached the sink: %v", calls)
	}
	if !strings.Contains(logs.String(), "signature does not verify") || !strings.Contains(logs.String(), "signature headers missing") {
		t.Errorf("refusals are not logged with their reason:\n%s", logs)
	}
}

// RFC 8032 section 7.1, test 2: the public key, message 0x72 ("r") and
// signature. As timestamp "r" and an empty body it verifies, so the handler
// gets past the signature (and refuses the empty body as JSON); one bit off
// and it answers 401.
func TestInteractionSignatureMatchesTheRFC8032Vector(t *testing.T) {
	t.Parallel()
	const (
		pub = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
		sig = "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"
	)
	c, err := discord.New("d", discord.Options{PublicKey: pub, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handler(newSink())
	for _, tt := range []struct {
		sig    string
		status int
	}{{sig, 400}, {sig[:len(sig)-1] + "1", 401}} {
		r := httptest.NewRequest(http.MethodPost, "/hooks/d", nil)
		r.Header.Set("X-Signature-Timestamp", "r")
		r.Header.Set("X-Signature-Ed25519", tt.sig)
		if status, body := serve(h, r); status != tt.status {
			t.Errorf("signature %s…: status %d (%s), want %d", tt.sig[:8], status, body, tt.status)
		}
	}
}

func TestASlashCommandIsDeferredThenAnsweredByFollowUps(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, nil)
	sink := newSink()
	const thread = "800000000000000003"
	body, token := fake.Command(discordtest.CommandSpec{ID: "1701", Channel: thread, ThreadParent: chanID, Guild: guild, User: alice, Name: "ask", Options: map[string]string{"question": "is it DNS?"}})
	status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	if status != 200 || answer != `{"type":5}` {
		t.Fatalf("command answered %d %s, want 200 {\"type\":5} (deferred)", status, answer)
	}
	m := sink.messages()
	if len(m) != 1 {
		t.Fatalf("sink got %d messages, want the command", len(m))
	}
	got := m[0]
	if got.ID != "1701" || got.Text != "is it DNS?" || got.Server != guild || got.Channel != chanID || got.Thread != thread || got.Author != "alice" || got.AuthorID != alice.ID {
		t.Errorf("command message = %+v", got)
	}
	if got.Meta[discord.MetaInteractionToken] != token || got.Meta[discord.MetaApplicationID] != fake.AppID {
		t.Errorf("Meta = %v, want the interaction token and application id for the follow-up", got.Meta)
	}

	reply := connector.Reply{RunID: "r", MessageID: got.ID, Channel: got.Channel, Thread: got.Thread, Text: strings.Repeat("It is always DNS. ", 150), Meta: got.Meta}
	if err := c.Send(context.Background(), reply); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 2 {
		t.Fatalf("%d follow-ups, want 2 for %d characters", len(posts), len(reply.Text))
	}
	for _, p := range posts {
		if p.Webhook != fake.AppID+"/"+token || p.Channel != "" || p.Authority != "" {
			t.Errorf("post %+v, want a follow-up on the interaction's webhook without the bot token", p)
		}
	}
	if strings.Contains(logs.String(), token) {
		t.Error("the interaction token reached the log")
	}
}

func TestASlashCommandThatCannotBeStoredAnswers500(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	sink := newSink()
	sink.failing(1)
	body, _ := fake.Command(discordtest.CommandSpec{ID: "1801", Channel: chanID, Guild: guild, User: alice, Name: "ask"})
	status, _ := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	if status != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 so Discord shows the failure", status)
	}
	if len(sink.messages()) != 0 {
		t.Error("a failed Accept stored something")
	}
	// Discord does not redeliver; the user runs the command again.
	body, _ = fake.Command(discordtest.CommandSpec{ID: "1802", Channel: chanID, Guild: guild, User: alice, Name: "ask"})
	if status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 || answer != `{"type":5}` {
		t.Fatalf("the next command answered %d %s", status, answer)
	}
	if m := sink.messages(); len(m) != 1 || m[0].Text != "/ask" {
		t.Errorf("stored %+v, want the command with no options as /ask", m)
	}
}

func TestSlashCommandsFromOtherGuildsAreAnsweredButNotRun(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, func(o *discord.Options) { o.GuildIDs = []string{other} })
	sink := newSink()
	body, _ := fake.Command(discordtest.CommandSpec{ID: "1901", Channel: chanID, Guild: guild, User: alice, Name: "ask"})
	status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	var resp struct {
		Type int `json:"type"`
		Data struct {
			Flags int `json:"flags"`
		} `json:"data"`
	}
	_ = json.Unmarshal([]byte(answer), &resp)
	if status != 200 || resp.Type != 4 || resp.Data.Flags != 64 {
		t.Errorf("answered %d %s, want an ephemeral message (type 4, flags 64)", status, answer)
	}
	if len(sink.acceptCalls()) != 0 {
		t.Error("a command from a guild outside guild_ids reached the sink")
	}
}

func TestWithoutAPublicKeyTheEndpointIsNotThere(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, func(o *discord.Options) { o.PublicKey = "" })
	if status, _ := serve(c.Handler(newSink()), fake.SignedRequest("/hooks/discord-main", fake.Ping())); status != 404 {
		t.Errorf("status %d, want 404", status)
	}
}
