package meepachat

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
)

// A message's attachments reach intake with a download URL on the
// instance; the request intake sends for one carries the bot token (the
// fake answers 401 without it), and a URL elsewhere is refused rather than
// given the token. A stored path that leaves the instance's paths is left
// out; a file alone is a message.
func TestAMessagesAttachmentsAreDownloadedFromTheInstanceWithTheBotToken(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	sink := newSink()
	connected(ctx, t, f, c, sink)

	plan := f.Store("plan.md", "text/markdown", []byte("# the plan\n"))
	evil := meepachattest.StoredFile{ID: "att-x", Filename: "x", StoredPath: "/uploads/../../etc/passwd", MimeType: "text/plain"}
	m := meepachattest.Message{ID: "m-files", ChannelID: dmID, UserID: "u-alice", User: &meepachattest.User{ID: "u-alice", Username: "alice"},
		Attachments: []meepachattest.StoredFile{plan, evil}}
	deliver(ctx, t, f, m)
	got := sink.wait(ctx, t, 1)[0]
	if len(got.Files) != 1 || got.Files[0].Name != "plan.md" || got.Files[0].Type != "text/markdown" || got.Files[0].Size != plan.SizeBytes ||
		got.Files[0].URL != f.URL+plan.StoredPath {
		t.Fatalf("files = %+v, want plan.md on the instance only", got.Files)
	}
	req, err := c.AttachmentRequest(ctx, got.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "# the plan\n" {
		t.Fatalf("download: %d %q", resp.StatusCode, body)
	}
	// The control: the same URL without the token is refused.
	bare, _ := http.NewRequestWithContext(ctx, http.MethodGet, got.Files[0].URL, nil)
	if resp, err := f.Client().Do(bare); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without the token: %v %v, want 401", resp, err)
	}
	for _, u := range []string{"https://evil.example/uploads/att-1/plan.md", "http://127.0.0.1:1/uploads/a", "http://user@" + strings.TrimPrefix(f.URL, "http://") + "/x"} {
		if _, err := c.AttachmentRequest(ctx, connector.Attachment{Name: "x", URL: u}); err == nil {
			t.Errorf("AttachmentRequest(%s) made a request with the bot token", u)
		}
	}
}
