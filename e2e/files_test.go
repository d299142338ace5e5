package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// A file the agent sends goes from its workspace through the scheduler
// (read beneath the workspace, copied into its state), over D-Bus as a
// descriptor (DeliverFiles), into intake's state, and up to Slack with the
// files upload v2 flow, in the message's thread.
func TestPlatformSlackAFileTheAgentSendsArrivesAsAnUploadInTheThread(t *testing.T) {
	t.Parallel()
	fake, _, ctx := startSlackPlatform(t, "xapp-1-e2e-files-app", "xoxb-e2e-files-bot", "")
	o := fake.Options()
	seq := 0
	send := func(t *testing.T, text string) slacktest.Event {
		t.Helper()
		seq++
		ev := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", Text: text,
			TS: fmt.Sprintf("1700000100.%06d", seq), Team: o.TeamID}
		if _, err := fake.Deliver(ctx, ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	posts, uploads := 0, 0
	waitReply := func(t *testing.T) slacktest.Post {
		t.Helper()
		got, err := fake.WaitPosts(ctx, posts+1)
		if err != nil {
			t.Fatal(err)
		}
		posts = len(got)
		return got[len(got)-1]
	}

	t.Run("A file left in outbox/ is uploaded in the thread", func(t *testing.T) {
		ev := send(t, "/sh mkdir -p outbox && printf 'col\\n42\\n' > outbox/answer.csv && echo wrote-it")
		p := waitReply(t)
		if !strings.Contains(p.Text, "wrote-it") || p.ThreadTS != ev.TS {
			t.Fatalf("posted %+v, want the shell output in thread %s", p, ev.TS)
		}
		ups, err := fake.WaitUploads(ctx, uploads+1)
		if err != nil {
			t.Fatal(err)
		}
		uploads = len(ups)
		u := ups[len(ups)-1]
		if u.Channel != "C0CHAN" || u.ThreadTS != ev.TS || len(u.Files) != 1 || u.Files[0].Name != "answer.csv" || string(u.Files[0].Data) != "col\n42\n" {
			t.Fatalf("upload = %+v, want answer.csv with its bytes in thread %s", u, ev.TS)
		}
	})
	t.Run("send_file attaches a workspace file with its caption", func(t *testing.T) {
		send(t, "/sh printf 'quarterly' > report.txt && echo made")
		waitReply(t)
		ev := send(t, `/tool send_file {"path":"report.txt","caption":"the report you asked for"}`)
		if p := waitReply(t); !strings.Contains(p.Text, "will be attached") {
			t.Fatalf("posted %q, want send_file's answer", p.Text)
		}
		ups, err := fake.WaitUploads(ctx, uploads+1)
		if err != nil {
			t.Fatal(err)
		}
		uploads = len(ups)
		u := ups[len(ups)-1]
		if u.ThreadTS != ev.TS || u.InitialComment != "the report you asked for" || len(u.Files) != 1 || string(u.Files[0].Data) != "quarterly" {
			t.Fatalf("upload = %+v, want report.txt with its caption in thread %s", u, ev.TS)
		}
	})
	// berth-agent leaves symlinks out of outbox/; the scheduler refuses one
	// a subverted agent names all the same (replyfiles_attack_test.go).
	t.Run("A symlink to /etc/shadow in outbox/ is not uploaded", func(t *testing.T) {
		send(t, "/sh mkdir -p outbox && ln -sf /etc/shadow outbox/shadow && echo linked")
		if p := waitReply(t); !strings.Contains(p.Text, "linked") {
			t.Fatalf("posted %q, want the shell output", p.Text)
		}
		// One reply is sent at a time, its files after its text: the next
		// upload is the next reply's, unless the symlink went up.
		send(t, "/sh printf z > outbox/z.txt && echo z")
		waitReply(t)
		ups, err := fake.WaitUploads(ctx, uploads+1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ups) != uploads+1 || ups[uploads].Files[0].Name != "z.txt" {
			t.Fatalf("uploads after the symlink = %+v, want only z.txt", ups[uploads:])
		}
	})
}
