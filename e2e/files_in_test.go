package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/services/intake/meepachat/meepachattest"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// A message's files come in through intake (it downloads or decodes them,
// never the sandbox), cross to the scheduler by descriptor and reach the
// run's workspace read-only under inbox/<message id>/, listed in the
// prompt; a file over [intake] max_attachment_bytes gets a reply saying so
// and runs nothing, and leaves nothing in either service's state. On the
// host backend (Landlock) and in a container.
func TestFilesInReachTheWorkspaceReadOnlyAndOversizedOnesAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, extra string }{
		{"landlock", ""},
		{"container", containerAgent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.name == "container" {
				testdocker.Engine(t)
			}
			s := start(t, []agentSpec{{id: "filer", extra: tc.extra}})
			payload := bytes.Repeat([]byte("berth-attachment-"), 3<<20/17) // ~3 MB
			sum := sha256.Sum256(payload)
			// The second file comes by URL from a server only intake may reach.
			var fetched int // read after the replies: intake's requests are done
			files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fetched++
				switch r.URL.Path {
				case "/notes.txt":
					w.Write([]byte("from a link\n"))
				case "/huge.bin":
					chunk := make([]byte, 1<<20)
					for range 30 {
						if _, err := w.Write(chunk); err != nil {
							return
						}
					}
				default:
					http.NotFound(w, r)
				}
			}))
			t.Cleanup(files.Close)

			script := `/sh cd inbox/*/ && echo dir=$(pwd) && sha256sum data.bin && cat notes.txt && ` +
				`(echo x >> data.bin) 2>/dev/null; echo append=$?; rm -f notes.txt 2>/dev/null; ls notes.txt >/dev/null 2>&1; echo kept=$?; ` +
				`touch new 2>/dev/null; echo create=$?`
			status, id := s.postAny(t, map[string]any{"channel": "filer", "author": "tester", "text": script,
				"files": []map[string]string{
					{"name": "../../data.bin", "type": "application/octet-stream", "base64": base64.StdEncoding.EncodeToString(payload)},
					{"name": "notes.txt", "url": files.URL + "/notes.txt"},
				}})
			if status != http.StatusAccepted {
				t.Fatalf("POST with files: %d %s", status, id)
			}
			reply := s.sink.wait(t, 3*time.Minute, id)[id]
			got := text(reply)
			for _, want := range []string{"/inbox/" + id, hex.EncodeToString(sum[:]) + "  data.bin", "from a link", "kept=0", "create=1", "[Attached files, read-only in the workspace:", "data.bin (application/octet-stream, 3145714 bytes)", "notes.txt (text/plain, 12 bytes)"} {
				if !strings.Contains(got, want) {
					t.Errorf("reply lacks %q:\n%s", want, got)
				}
			}

			if strings.Contains(got, "append=0") {
				t.Errorf("the run could append to its attachment:\n%s", got)
			}
			// Over the cap: refused with a reply, no run.
			status, big := s.postAny(t, map[string]any{"channel": "filer", "author": "tester", "text": "/sh echo must-not-run",
				"files": []map[string]string{{"name": "huge.bin", "url": files.URL + "/huge.bin"}}})
			if status != http.StatusAccepted {
				t.Fatalf("POST with a 30 MB file: %d %s", status, big)
			}
			refused := s.sink.wait(t, time.Minute, big)[big]
			if rt := text(refused); !strings.Contains(rt, "huge.bin is larger than 25.0 MiB") || strings.Contains(rt, "must-not-run") {
				t.Errorf("reply to the 30 MB file: %q, want the cap named and no run", rt)
			}
			if rid, _ := refused["run_id"].(string); !strings.HasPrefix(rid, "refused-") {
				t.Errorf("the refused message has run id %q: it ran", rid)
			}
			// Neither service keeps a copy once the run has its own.
			dirs, _ := filepath.Glob(filepath.Join(s.StateDir, "*", "attachments", "*"))
			for _, d := range dirs {
				t.Errorf("intake still holds %s after the hand-off", d)
			}
			if fetched != 2 {
				t.Errorf("the file server was asked %d times, want 2 (once per linked file, by intake)", fetched)
			}
		})
	}
}

// postAny posts a signed webhook message of any JSON shape and returns the
// status and the id answered ("" for a refusal).
func (s *suite) postAny(t *testing.T, msg map[string]any) (int, string) {
	t.Helper()
	body, _ := json.Marshal(msg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := s.Post(ctx, "hooks", []byte(secret), body)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.ID
}

// A file shared on Slack is downloaded by intake with the bot token (Slack
// answers its sign-in page without it) and reaches the run's workspace.
func TestPlatformSlackASharedFileReachesTheWorkspace(t *testing.T) {
	t.Parallel()
	fake, _, ctx := startSlackPlatform(t, "xapp-1-e2e-filesin-app", "xoxb-e2e-filesin-bot", "")
	o := fake.Options()
	f := fake.Share("plan.md", "text/markdown", []byte("# the plan\nship it\n"))
	ev := slacktest.Event{Type: "message", Subtype: "file_share", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE",
		Text: "/sh cat inbox/*/plan.md", TS: "1700000200.000001", Team: o.TeamID, Files: []slacktest.File{f}}
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	posts, err := fake.WaitPosts(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := posts[len(posts)-1].Text; !strings.Contains(got, "ship it") || !strings.Contains(got, "plan.md (text/markdown, 19 bytes)") {
		t.Fatalf("reply %q: want the shared file's text, read from the workspace, and the prompt's listing", got)
	}
	if n := fake.SharedFetches(); n != 1 {
		t.Errorf("the file was downloaded with the bot token %d times, want 1", n)
	}
}

// A file attached on MeepaChat is downloaded by intake from the instance
// with the bot token (the fake refuses it without) and reaches the run's
// workspace.
func TestPlatformMeepaChatAnAttachedFileReachesTheWorkspace(t *testing.T) {
	t.Parallel()
	serverID := "srv1"
	fake := meepachattest.New(meepachattest.Options{
		Token: "bot1.e2e-meepa-files-secret",
		Bot:   meepachattest.User{ID: "bot1", Username: "berth", Bot: true},
		Servers: []meepachattest.Server{{ID: serverID, Name: "ops", Channels: []meepachattest.Channel{
			{ID: "chan1", ServerID: &serverID, Name: "general"},
		}}},
	})
	t.Cleanup(fake.Close)
	startPlatform(t, fmt.Sprintf("[[connectors]]\nid = \"meepa\"\ntype = \"meepachat\"\nbase_url = %q\ntoken = \"$MEEPA_TOKEN\"\ntrigger = \"all\"\n", fake.URL),
		[]string{"MEEPA_TOKEN=bot1.e2e-meepa-files-secret"}, "e2e-meepa-files-secret")
	ctx := platformCtx(t)
	if err := fake.WaitConnections(ctx, 1, "chan1"); err != nil {
		t.Fatal(err)
	}
	f := fake.Store("plan.md", "text/markdown", []byte("# the plan\nship it\n"))
	alice := &meepachattest.User{ID: "u1", Username: "alice"}
	m := meepachattest.Message{ID: "m-file", ChannelID: "chan1", UserID: alice.ID, User: alice, Content: "/sh cat inbox/*/plan.md",
		Attachments: []meepachattest.StoredFile{f}}
	if n, err := fake.Deliver(ctx, m); err != nil || n != 1 {
		t.Fatalf("deliver: %d, %v", n, err)
	}
	posts, err := fake.WaitPosted(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := posts[len(posts)-1].Content; !strings.Contains(got, "ship it") || !strings.Contains(got, "plan.md (text/markdown, 19 bytes)") {
		t.Fatalf("reply %q: want the attached file's text, read from the workspace, and the prompt's listing", got)
	}
	if n := fake.Downloads(); n != 1 {
		t.Errorf("the file was downloaded with the bot token %d times, want 1", n)
	}
}
