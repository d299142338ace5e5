package meepachat

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
)

func replyFile(t *testing.T, name string, size int, caption string) connector.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "0")
	if err := os.WriteFile(path, []byte(strings.Repeat("x", size)), 0o600); err != nil {
		t.Fatal(err)
	}
	return connector.File{Name: name, Type: "text/plain", Caption: caption, Size: int64(size), Path: path}
}

func TestAReplysFilesAreUploadedAndPostedWithTheirAttachmentIDsInTheThread(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	c, _ := newTestConnector(t, f, nil)
	r := reply("Your files.")
	for i := range 11 {
		r.Files = append(r.Files, replyFile(t, fmt.Sprintf("f%02d.txt", i), i+1, ""))
	}
	r.Files[0].Caption = "the first"
	r.Files = append(r.Files, replyFile(t, "huge.bin", 25<<20+1, ""))
	if err := c.Send(ctx, r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posted := f.Posted()
	if len(posted) != 3 {
		t.Fatalf("%d messages, want the text and two with files: %+v", len(posted), posted)
	}
	if !strings.Contains(posted[0].Content, "huge.bin was not sent: it is 25.0 MiB, more than the 25 MiB MeepaChat takes") || len(posted[0].Attachments) != 0 {
		t.Errorf("text = %q, want a note about huge.bin", posted[0].Content)
	}
	if n := len(posted[1].Attachments); n != 10 || posted[1].Content != "f00.txt: the first" {
		t.Errorf("second message: %d files, content %q; want 10 and the first's caption", n, posted[1].Content)
	}
	if n := len(posted[2].Attachments); n != 1 || posted[2].Content != "f10.txt" {
		t.Errorf("third message: %d files, content %q; want f10.txt named", n, posted[2].Content)
	}
	for i, p := range posted[1:] {
		if p.ThreadID != "m-root" || p.ChannelID != channelID {
			t.Errorf("message %d went to %+v, want the thread", i+2, p)
		}
		for j, a := range p.Attachments {
			n := i*10 + j
			if a.Filename != fmt.Sprintf("f%02d.txt", n) || len(a.Data) != n+1 || a.MimeType != "text/plain" {
				t.Errorf("attachment %d = %s (%d bytes, %s), want f%02d.txt of %d bytes", n, a.Filename, len(a.Data), a.MimeType, n, n+1)
			}
		}
	}
}
