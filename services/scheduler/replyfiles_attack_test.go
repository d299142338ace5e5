package scheduler

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/workspacefile"
	"github.com/berth-dev/berth/isolation"
)

// The agent controls its workspace; the scheduler, as root, reads the files
// a reply names from it. None of these may make it read anything but a
// regular file of the workspace within the caps.
func TestCollectReplyFilesTakesOnlyRegularWorkspaceFilesWithinTheCaps(t *testing.T) {
	t.Parallel()
	const secret = "sk-live-0123456789abcdef"
	caps := isolation.FileCaps{File: 1 << 10, Total: 1 << 10}
	tests := []struct {
		name     string
		make     func(t *testing.T, ws string)
		path     string
		wantNote string // "" when the file is taken
		wantData string
	}{
		{"A_regular_file_in_outbox_is_taken", func(t *testing.T, ws string) { write(t, ws, "outbox/r.txt", "result") }, "outbox/r.txt", "", "result"},
		{"A_symlink_to_etc_shadow_is_refused", func(t *testing.T, ws string) { symlink(t, "/etc/shadow", ws, "outbox/x") }, "outbox/x", "symbolic link", ""},
		{"A_symlink_inside_the_workspace_is_refused_too", func(t *testing.T, ws string) {
			write(t, ws, "real.txt", "x")
			symlink(t, "../real.txt", ws, "outbox/x")
		}, "outbox/x", "symbolic link", ""},
		{"A_path_through_a_symlinked_directory_is_refused", func(t *testing.T, ws string) { symlink(t, "/etc", ws, "etc") }, "etc/passwd", "symbolic link", ""},
		{"A_path_with_dotdot_is_refused", func(t *testing.T, ws string) {}, "../../../etc/passwd", "not inside the workspace", ""},
		{"A_dotdot_hidden_in_the_middle_is_refused", func(t *testing.T, ws string) { write(t, ws, "a/b", "x") }, "a/../../etc/passwd", "not inside the workspace", ""},
		{"A_fifo_is_refused_without_blocking", func(t *testing.T, ws string) {
			mkdir(t, ws, "outbox")
			if err := syscall.Mkfifo(filepath.Join(ws, "outbox", "pipe"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "outbox/pipe", "not a regular file", ""},
		{"A_directory_is_refused", func(t *testing.T, ws string) { mkdir(t, ws, "outbox/dir") }, "outbox/dir", "not a regular file", ""},
		{"A_hard_link_is_refused", func(t *testing.T, ws string) {
			// As root this links any file; the agent's uid can link only
			// what it owns where fs.protected_hardlinks is on.
			write(t, ws, "private", "root's")
			mkdir(t, ws, "outbox")
			if err := os.Link(filepath.Join(ws, "private"), filepath.Join(ws, "outbox", "l")); err != nil {
				t.Fatal(err)
			}
		}, "outbox/l", "more than one hard link", ""},
		{"A_file_over_max_reply_file_bytes_is_refused", func(t *testing.T, ws string) {
			write(t, ws, "outbox/big", "")
			if err := os.Truncate(filepath.Join(ws, "outbox", "big"), 1<<40); err != nil { // sparse: a terabyte
				t.Fatal(err)
			}
		}, "outbox/big", "more than the 1 KiB", ""},
		{"A_missing_file_is_refused", func(t *testing.T, ws string) {}, "gone.txt", "does not exist", ""},
		{"A_secret_in_a_text_file_is_redacted", func(t *testing.T, ws string) { write(t, ws, "env.txt", "KEY="+secret+"\n") }, "env.txt", "", "KEY=[redacted]\n"},
		{"A_binary_file_holding_a_secret_is_refused", func(t *testing.T, ws string) { write(t, ws, "blob", "\x00\xff"+secret) }, "blob", "holds a secret", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws := t.TempDir()
			tc.make(t, ws)
			dest := filepath.Join(t.TempDir(), "run-1")
			taken, err := collectFromHost(t, ws, []agentproto.OutFile{{Path: tc.path, Caption: "c"}}, []string{secret}, caps, dest)
			if err != nil {
				t.Fatalf("collectReplyFiles: %v", err)
			}
			if tc.wantNote != "" {
				if len(taken.files) != 0 || len(taken.notes) != 1 || !strings.Contains(taken.notes[0], tc.wantNote) {
					t.Fatalf("taken = %+v, want no file and a note saying %q", taken, tc.wantNote)
				}
				if entries, _ := os.ReadDir(dest); len(entries) != 0 {
					t.Errorf("the scheduler's state holds %d files for a refused one", len(entries))
				}
				return
			}
			if len(taken.notes) != 0 || len(taken.files) != 1 {
				t.Fatalf("taken = %+v, want the file and no note", taken)
			}
			got, err := os.ReadFile(filepath.Join(dest, "0"))
			if err != nil || string(got) != tc.wantData || taken.files[0].Size != int64(len(tc.wantData)) || taken.files[0].Caption != "c" {
				t.Fatalf("stored %q (%v) as %+v, want %q", got, err, taken.files[0], tc.wantData)
			}
		})
	}
}

func TestCollectReplyFilesEmptiesOutboxButLeavesSentFilesAndKeepsToTheTotal(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	write(t, ws, "report.csv", "a,b\n")
	write(t, ws, "outbox/one.txt", strings.Repeat("1", 600))
	write(t, ws, "outbox/two.txt", strings.Repeat("2", 600))
	symlink(t, "/etc/shadow", ws, "outbox/shadow")
	dest := filepath.Join(t.TempDir(), "run-2")
	want := []agentproto.OutFile{{Path: "report.csv"}, {Path: "outbox/one.txt"}, {Path: "outbox/two.txt"}, {Path: "outbox/shadow"}}
	taken, err := collectFromHost(t, ws, want, nil, isolation.FileCaps{File: 1 << 10, Total: 1 << 10}, dest)
	if err != nil {
		t.Fatal(err)
	}
	if len(taken.files) != 2 || taken.files[0].Name != "report.csv" || taken.files[1].Name != "one.txt" || taken.files[0].Type != "text/csv; charset=utf-8" {
		t.Fatalf("files = %+v, want report.csv and one.txt (two.txt passes the total)", taken.files)
	}
	if len(taken.notes) != 2 || !strings.Contains(taken.notes[0], "two.txt") || !strings.Contains(taken.notes[1], "shadow") {
		t.Errorf("notes = %q, want one for two.txt (total) and one for shadow", taken.notes)
	}
	if _, err := os.Stat(filepath.Join(ws, "report.csv")); err != nil {
		t.Errorf("a file sent with send_file was removed from the workspace: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(ws, "outbox")); len(entries) != 0 {
		t.Errorf("outbox/ still holds %d entries: each goes out with one reply only", len(entries))
	}
	if _, err := os.Stat("/etc/shadow"); err != nil && !os.IsNotExist(err) {
		t.Fatalf("stat /etc/shadow: %v", err)
	}
}

func write(t *testing.T, ws, rel, content string) {
	t.Helper()
	p := filepath.Join(ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, ws, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(ws, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, ws, rel string) {
	t.Helper()
	mkdir(t, ws, filepath.Dir(rel))
	if err := os.Symlink(target, filepath.Join(ws, rel)); err != nil {
		t.Fatal(err)
	}
}

// collectFromHost is collectReplyFiles beneath the workspace directory ws.
func collectFromHost(t *testing.T, ws string, want []agentproto.OutFile, secrets []string, caps isolation.FileCaps, dest string) (takenFiles, error) {
	t.Helper()
	fd, err := workspacefile.Open(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	return collectReplyFiles(hostSource(fd), want, secrets, caps, dest)
}
