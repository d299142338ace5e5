package intake

import (
	"context"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

// replyFile is a file to hand to DeliverFiles, as the scheduler does: an
// open descriptor of a file in a directory of the sender's.
func replyFile(t *testing.T, name, content, caption string) busapi.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return busapi.File{Name: name, Type: "text/csv", Caption: caption, Size: int64(len(content)), Open: f}
}

func storedDirs(t *testing.T, stateDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(stateDir, replyFilesDir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func acceptWebhookMessage(t *testing.T, s *Service) {
	t.Helper()
	if status, out := post(t, s, signedRequest("hooks", []byte(`{"id":"m-1","channel":"ops","author":"ada","text":"the report?"}`), testSecret, time.Now())); status != http.StatusAccepted {
		t.Fatalf("post: %d %v", status, out)
	}
}

func TestDeliverFilesKeepsACopyThatOutlivesTheSenderAndARestartAndPostsItToTheWebhook(t *testing.T) {
	t.Parallel()
	rs := newReplyServer(t, 0)
	cfg := testConfig(rs.URL)
	s, dbPath := newTestService(t, cfg)
	stateDir := filepath.Dir(dbPath)
	b := exportOnPrivateBus(t, s)
	acceptWebhookMessage(t, s)

	csv := "a,b\n1,2\n"
	f := replyFile(t, "report.csv", csv, "the numbers")
	reply := busapi.Reply{RunID: "run-7", MessageID: "m-1", Connector: "hooks", State: "succeeded", Text: "here you are", Files: []busapi.File{f}}
	if err := busapi.NewIntake(b.Conn(t)).DeliverFiles(context.Background(), reply); err != nil {
		t.Fatalf("DeliverFiles: %v", err)
	}
	// The sender may delete its copy once the call returned.
	if err := os.Remove(f.Open.Name()); err != nil {
		t.Fatal(err)
	}
	if dirs := storedDirs(t, stateDir); len(dirs) != 1 || strings.HasPrefix(dirs[0], ".tmp-") {
		t.Fatalf("reply-files holds %v, want one reply's directory", dirs)
	}
	// Delivering it again stores nothing more.
	if err := busapi.NewIntake(b.Conn(t)).DeliverFiles(context.Background(), reply); err != nil {
		t.Fatalf("second DeliverFiles: %v", err)
	}
	if dirs := storedDirs(t, stateDir); len(dirs) != 1 {
		t.Fatalf("reply-files holds %v after a repeated delivery, want one directory", dirs)
	}

	// A restart before the reply is posted still has the file.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := New(cfg, stateDir, WithRetryDelays(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	runService(t, s2)
	eventually(t, "the reply posted", func() bool { _, accepted := rs.counts(); return accepted > 0 })
	rs.mu.Lock()
	got := rs.accepted[0]
	rs.mu.Unlock()
	if len(got.Files) != 1 {
		t.Fatalf("posted files = %+v, want one", got.Files)
	}
	pf := got.Files[0]
	data, err := base64.StdEncoding.DecodeString(pf.Base64)
	if err != nil || string(data) != csv || pf.Name != "report.csv" || pf.Type != "text/csv" || pf.Size != int64(len(csv)) || pf.Caption != "the numbers" {
		t.Fatalf("posted file = %+v (bytes %q, %v), want report.csv with its bytes, type, size and caption", pf, data, err)
	}
	if got.Text != "here you are" {
		t.Errorf("posted text = %q", got.Text)
	}
	// Delivered: its files are gone with it.
	eventually(t, "the delivered reply's files removed", func() bool { return len(storedDirs(t, stateDir)) == 0 })
}

func TestDeliverFilesRefusesAFileWhoseBytesAreNotItsSizeAndLeavesNothing(t *testing.T) {
	t.Parallel()
	s, dbPath := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	acceptWebhookMessage(t, s)
	good := replyFile(t, "a.csv", "1,2\n", "")
	lying := replyFile(t, "b.csv", "short", "")
	lying.Size = 1 << 20
	err := busapi.NewIntake(b.Conn(t)).DeliverFiles(context.Background(), busapi.Reply{RunID: "run-8", MessageID: "m-1", Connector: "hooks", State: "succeeded", Files: []busapi.File{good, lying}})
	if bus.ErrorName(err) != bus.ErrInvalidArgument {
		t.Fatalf("DeliverFiles with a file shorter than its size = %v, want %s", err, bus.ErrInvalidArgument)
	}
	if dirs := storedDirs(t, filepath.Dir(dbPath)); len(dirs) != 0 {
		t.Errorf("reply-files holds %v after a refused delivery, want nothing", dirs)
	}
	if replies := outboxEntries(t, s); len(replies) != 0 {
		t.Errorf("outbox = %+v after a refused delivery, want empty", replies)
	}
}

func TestRetentionRemovesReplyFilesNoPendingReplyNames(t *testing.T) {
	t.Parallel()
	s, dbPath := newTestService(t, testConfig(""))
	stateDir := filepath.Dir(dbPath)
	acceptWebhookMessage(t, s)
	// A pending reply (no reply_url: it is never posted) keeps its files.
	if err := s.Deliver(busapi.Reply{RunID: "run-9", MessageID: "m-1", Connector: "hooks", State: "succeeded",
		Files: []busapi.File{replyFile(t, "kept.csv", "1\n", "")}}); err != nil {
		t.Fatal(err)
	}
	kept := storedDirs(t, stateDir)
	if len(kept) != 1 {
		t.Fatalf("reply-files holds %v, want one directory", kept)
	}
	// What a crash between the copy and the commit leaves, and a
	// directory of a reply long gone.
	for _, orphan := range []string{"0123abcd.run-crashed", "ffff0000.run-9"} {
		if err := os.MkdirAll(filepath.Join(stateDir, replyFilesDir, orphan), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	s.prune(context.Background())
	if dirs := storedDirs(t, stateDir); len(dirs) != 1 || dirs[0] != kept[0] {
		t.Errorf("reply-files holds %v after the retention pass, want only %v", dirs, kept)
	}
}
