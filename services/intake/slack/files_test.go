package slack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

func replyFile(t *testing.T, name, content, caption string) connector.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "0")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return connector.File{Name: name, Type: "text/plain", Caption: caption, Size: int64(len(content)), Path: path}
}

func TestAReplysFilesAreUploadedWithTheV2FlowIntoTheThread(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	thread := "1767326125.000100"
	r := connector.Reply{RunID: "run-f", MessageID: "C0CHAN:1.0001", Channel: "C0CHAN", Thread: thread, Text: "Here is the report.",
		Files: []connector.File{
			replyFile(t, "report.csv", "a,b\n1,2\n", "the numbers"),
			replyFile(t, "empty.txt", "", ""),
			replyFile(t, "notes.md", "# notes\n", ""),
		}}
	if err := c.Send(ctx, r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 1 || !strings.HasPrefix(posts[0].Text, "Here is the report.") || !strings.Contains(posts[0].Text, "empty.txt was not sent: it is empty") {
		t.Fatalf("posts = %+v, want the text with a note that empty.txt was not sent", posts)
	}
	ups := fake.Uploads()
	if len(ups) != 2 {
		t.Fatalf("uploads = %+v, want report.csv and notes.md", ups)
	}
	for i, want := range []struct{ name, data, comment string }{{"report.csv", "a,b\n1,2\n", "the numbers"}, {"notes.md", "# notes\n", ""}} {
		u := ups[i]
		if u.Channel != "C0CHAN" || u.ThreadTS != thread || u.InitialComment != want.comment || len(u.Files) != 1 ||
			u.Files[0].Name != want.name || string(u.Files[0].Data) != want.data {
			t.Errorf("upload %d = %+v, want %s with its bytes in the thread, comment %q", i, u, want.name, want.comment)
		}
	}
}

func TestAFileSlackRefusesIsANoteInTheThreadNotAFailedReply(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	big := replyFile(t, "huge.bin", "x", "")
	big.Size = 2 << 30 // more than Slack's 1 GB: FitFiles leaves it out unread
	r := connector.Reply{RunID: "run-g", MessageID: "C0CHAN:1.0002", Channel: "C0CHAN", Text: "Done.", Files: []connector.File{big}}
	if err := c.Send(ctx, r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 1 || !strings.Contains(posts[0].Text, "huge.bin was not sent: it is 2048 MiB, more than the 1024 MiB Slack takes") {
		t.Fatalf("posts = %+v, want a note that huge.bin was not sent", posts)
	}
	if ups := fake.Uploads(); len(ups) != 0 {
		t.Errorf("uploads = %+v, want none", ups)
	}
}
