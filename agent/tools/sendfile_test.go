package tools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestSendFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		path    string
		wantErr string // "" for success
		want    string // the path recorded
	}{
		{"A_workspace_file_is_attached", "report.txt", "", "report.txt"},
		{"A_file_in_a_subdirectory_is_attached", "out/chart.png", "", "out/chart.png"},
		{"An_absolute_path_inside_the_workspace_is_attached", "{ws}/report.txt", "", "report.txt"},
		{"A_missing_file_is_an_error_that_says_so", "nope.txt", "does not exist", ""},
		{"A_path_with_dotdot_out_of_the_workspace_is_refused", "../../etc/passwd", "outside the workspace", ""},
		{"An_absolute_path_outside_the_workspace_is_refused", "/etc/passwd", "outside the workspace", ""},
		{"A_symlink_is_refused", "link", "symbolic link", ""},
		{"A_directory_is_refused", "out", "not a regular file", ""},
		{"A_fifo_is_refused", "fifo", "not a regular file", ""},
		{"A_file_through_a_directory_symlink_out_of_the_workspace_is_refused", "etc/passwd", "outside the workspace", ""},
		{"The_workspace_itself_is_refused", ".", "outside the workspace", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := workspace(t)
			env.Outbox = NewOutbox()
			ws := env.Workspace
			mustWrite(t, filepath.Join(ws, "report.txt"), "numbers")
			mustWrite(t, filepath.Join(ws, "out", "chart.png"), "\x89PNG")
			if err := os.Symlink("/etc/passwd", filepath.Join(ws, "link")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc", filepath.Join(ws, "etc")); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			args, _ := json.Marshal(map[string]string{"path": strings.ReplaceAll(tc.path, "{ws}", ws), "caption": "  here it is "})
			out, err := Filter(Builtin(env), nil, nil).Call(context.Background(), "send_file", args)
			files := env.Outbox.Files(ws)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("send_file(%s) = %q, %v; want an error saying %q", tc.path, out, err, tc.wantErr)
				}
				if len(files) != 0 {
					t.Errorf("files = %v after a refusal, want none", files)
				}
				return
			}
			if err != nil {
				t.Fatalf("send_file(%s): %v", tc.path, err)
			}
			want := []agentproto.OutFile{{Path: tc.want, Caption: "here it is"}}
			if !slices.Equal(files, want) {
				t.Errorf("files = %v, want %v", files, want)
			}
		})
	}
}

func TestOutboxFilesAreTheSentOnesThenTheRegularFilesOfOutbox(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	env.Outbox = NewOutbox()
	ws := env.Workspace
	mustWrite(t, filepath.Join(ws, "a.txt"), "a")
	mustWrite(t, filepath.Join(ws, "outbox", "z.csv"), "z")
	mustWrite(t, filepath.Join(ws, "outbox", "b.txt"), "b")
	mustWrite(t, filepath.Join(ws, "outbox", "sub", "deep.txt"), "deep")
	if err := os.Symlink("/etc/shadow", filepath.Join(ws, "outbox", "shadow")); err != nil {
		t.Fatal(err)
	}
	set := Filter(Builtin(env), nil, nil)
	for _, args := range []string{`{"path":"a.txt","caption":"first"}`, `{"path":"outbox/b.txt","caption":"bee"}`} {
		if _, err := set.Call(context.Background(), "send_file", json.RawMessage(args)); err != nil {
			t.Fatal(err)
		}
	}
	got := env.Outbox.Files(ws)
	want := []agentproto.OutFile{{Path: "a.txt", Caption: "first"}, {Path: "outbox/b.txt", Caption: "bee"}, {Path: "outbox/z.csv"}}
	if !slices.Equal(got, want) {
		t.Errorf("files = %v, want %v (sent first, each once; no symlink, no subdirectory)", got, want)
	}
}

func TestSendFileStopsAtTheMostFilesAReplyCarries(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	env.Outbox = NewOutbox()
	set := Filter(Builtin(env), nil, nil)
	for i := range agentproto.MaxOutFiles + 1 {
		name := filepath.Join(env.Workspace, "f"+strings.Repeat("x", i)+".txt")
		mustWrite(t, name, "x")
		args, _ := json.Marshal(map[string]string{"path": filepath.Base(name)})
		_, err := set.Call(context.Background(), "send_file", args)
		if i < agentproto.MaxOutFiles && err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		if i == agentproto.MaxOutFiles && (err == nil || !strings.Contains(err.Error(), "at most")) {
			t.Fatalf("file %d over the limit: %v, want an error", i, err)
		}
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
