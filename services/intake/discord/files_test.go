package discord_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

func replyFile(t *testing.T, name string, size int, caption string) connector.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "0")
	data := []byte(strings.Repeat(name[:1], size))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return connector.File{Name: name, Type: "application/octet-stream", Caption: caption, Size: int64(size), Path: path}
}

func TestAReplysFilesArriveAsMultipartAttachmentsWithinDiscordsLimits(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	var files []connector.File
	for i := range 11 { // one more than a message takes
		files = append(files, replyFile(t, fmt.Sprintf("f%02d.txt", i), 10, ""))
	}
	files[0].Caption = "the first"
	files = append(files,
		replyFile(t, "big.bin", 6<<20, ""),    // with the next, more than a request takes
		replyFile(t, "bigger.bin", 6<<20, ""), // so it goes in a message of its own
		replyFile(t, "huge.bin", 11<<20, ""),  // more than Discord takes at all
	)
	err := c.Send(context.Background(), connector.Reply{RunID: "run-files", MessageID: "1301", Channel: chanID, Text: "Your files.", Files: files})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 4 {
		t.Fatalf("%d posts, want the text and three messages of files: %+v", len(posts), posts)
	}
	if !strings.HasPrefix(posts[0].Content, "Your files.") || !strings.Contains(posts[0].Content, "huge.bin was not sent: it is 11 MiB, more than the 10 MiB Discord takes") || len(posts[0].Files) != 0 {
		t.Errorf("first post = %q, want the text with a note about huge.bin", posts[0].Content)
	}
	want := [][]string{
		{"f00.txt", "f01.txt", "f02.txt", "f03.txt", "f04.txt", "f05.txt", "f06.txt", "f07.txt", "f08.txt", "f09.txt"},
		{"f10.txt", "big.bin"},
		{"bigger.bin"},
	}
	nonces := map[string]bool{posts[0].Nonce: true}
	for i, names := range want {
		p := posts[i+1]
		var got []string
		for _, f := range p.Files {
			got = append(got, f.Name)
			if int64(len(f.Data)) != sizeOf(files, f.Name) {
				t.Errorf("%s arrived with %d bytes, want %d", f.Name, len(f.Data), sizeOf(files, f.Name))
			}
		}
		if strings.Join(got, ",") != strings.Join(names, ",") {
			t.Errorf("message %d carries %v, want %v", i+1, got, names)
		}
		if p.Channel != chanID || !p.EnforceNonce || nonces[p.Nonce] {
			t.Errorf("message %d: channel %s, nonce %q (enforced %v), want %s and a nonce of its own", i+1, p.Channel, p.Nonce, p.EnforceNonce, chanID)
		}
		nonces[p.Nonce] = true
	}
	if f := posts[1].Files[0]; f.Description != "the first" || !strings.Contains(posts[1].Content, "f00.txt: the first") {
		t.Errorf("the first file's caption: description %q, content %q", f.Description, posts[1].Content)
	}
}

func sizeOf(files []connector.File, name string) int64 {
	for _, f := range files {
		if f.Name == name {
			return f.Size
		}
	}
	return -1
}

func TestAFileMessageSentAgainAfterALostAnswerIsNotPostedTwice(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	r := connector.Reply{RunID: "run-lost", MessageID: "1302", Channel: chanID, Text: "here", Files: []connector.File{replyFile(t, "a.txt", 3, "")}}
	fake.LoseNextResponses(2) // the text's answer and the file message's
	for range 3 {
		if err := c.Send(context.Background(), r); err == nil {
			break
		}
	}
	var withFiles int
	for _, p := range fake.Posts() {
		if len(p.Files) > 0 {
			withFiles++
		}
	}
	if withFiles != 1 {
		t.Errorf("%d messages with the file, want 1 (the nonce returns the first)", withFiles)
	}
}
