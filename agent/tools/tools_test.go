package tools

import (
	"context"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func workspace(t *testing.T) Env {
	t.Helper()
	ws, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(ws, ".tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	return Env{Workspace: ws, TmpDir: tmp}
}

func names(s *Set) []string {
	var out []string
	for _, spec := range s.Specs() {
		out = append(out, spec.Name)
	}
	return out
}

// allTools are MeepaGateway's tool names, in Builtin's order.
var allTools = []string{"shell", "read_file", "write_file", "list_dir", "web_fetch",
	"memory_store", "memory_search", "memory_delete", "memory_note", "memory_read", "soul_read", "soul_edit", "send_file"}

func TestFilter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		allow, deny []string
		want        []string
	}{
		{"An_empty_allow_list_allows_every_tool", nil, nil, allTools},
		{"An_allow_list_keeps_only_the_named_tools", []string{"read_file", "list_dir"}, nil, []string{"read_file", "list_dir"}},
		{"Deny_removes_a_tool_from_all", nil, []string{"shell"}, allTools[1:]},
		{"Deny_wins_over_allow", []string{"shell", "read_file"}, []string{"shell"}, []string{"read_file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := names(Filter(Builtin(Env{}), tc.allow, tc.deny))
			if !slices.Equal(got, tc.want) {
				t.Errorf("tools = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCallingAToolOutsideTheSetIsAnErrorForTheModel(t *testing.T) {
	t.Parallel()
	s := Filter(Builtin(workspace(t)), nil, []string{"shell"})
	for _, name := range []string{"shell", "no_such_tool"} {
		if _, err := s.Call(context.Background(), name, json.RawMessage(`{"command":"true"}`)); err == nil || !strings.Contains(err.Error(), "not available") {
			t.Errorf("Call(%s) error = %v, want 'not available'", name, err)
		}
	}
}

func TestBadArgumentsAreErrorsForTheModel(t *testing.T) {
	t.Parallel()
	s := Filter(Builtin(workspace(t)), nil, nil)
	tests := []struct{ name, tool, args string }{
		{"Wrong_type", "shell", `{"command": 3}`},
		{"Unknown_field", "read_file", `{"path": "a", "mode": "x"}`},
		{"Missing_command", "shell", `{}`},
		{"Missing_content", "write_file", `{"path": "a"}`},
		{"Not_JSON", "list_dir", `path=.`},
		{"Negative_timeout", "shell", `{"command": "true", "timeout": -1}`},
		{"Empty_path", "read_file", `{"path": ""}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.Call(context.Background(), tc.tool, json.RawMessage(tc.args))
			if err == nil || !strings.Contains(err.Error(), "bad arguments") {
				t.Errorf("error = %v, want 'bad arguments'", err)
			}
		})
	}
}

func runShell(t *testing.T, env Env, args string) ShellResult {
	t.Helper()
	out, err := shell{env}.Call(context.Background(), json.RawMessage(args))
	if err != nil {
		t.Fatalf("shell: %v", err)
	}
	var res ShellResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("shell output %q is not a ShellResult: %v", out, err)
	}
	return res
}

func TestShellReportsStdoutStderrAndExitCode(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	res := runShell(t, env, `{"command": "pwd; echo oops >&2; exit 3"}`)
	if res.Stdout != env.Workspace+"\n" || res.Stderr != "oops\n" || res.ExitCode != 3 || res.TimedOut {
		t.Errorf("result = %+v, want stdout %q, stderr oops, exit code 3", res, env.Workspace)
	}
}

func TestShellGetsAMinimalEnvironment(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	res := runShell(t, env, `{"command": "env"}`)
	allowed := map[string]bool{"PATH": true, "HOME": true, "TMPDIR": true, "LANG": true, "PWD": true, "SHLVL": true, "_": true, "OLDPWD": true}
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		name, _, _ := strings.Cut(line, "=")
		if !allowed[name] {
			t.Errorf("shell environment has %s", name)
		}
	}
	for _, want := range []string{"PATH=" + ShellPath, "HOME=" + env.Workspace, "TMPDIR=" + env.TmpDir, "LANG=C.UTF-8"} {
		if !strings.Contains(res.Stdout, want+"\n") {
			t.Errorf("shell environment lacks %s:\n%s", want, res.Stdout)
		}
	}
}

func TestShellOutputIsCappedWithAMarker(t *testing.T) {
	t.Parallel()
	res := runShell(t, workspace(t), `{"command": "head -c 100000 /dev/zero | tr '\\0' a"}`)
	if !strings.HasPrefix(res.Stdout, strings.Repeat("a", ShellOutputLimit)+"\n[... ") ||
		!strings.HasSuffix(res.Stdout, "more bytes truncated]") {
		t.Errorf("stdout is %d bytes ending %q, want %d bytes of output and a truncation marker",
			len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-60):], ShellOutputLimit)
	}
}

func TestShellTimeoutKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	start := time.Now()
	res := runShell(t, env, `{"command": "(sleep 30; touch late) & sleep 30", "timeout": 1}`)
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("shell returned after %s, want about 1s", elapsed)
	}
	if !res.TimedOut || !strings.Contains(res.Stderr, "timed out after 1s") {
		t.Errorf("result = %+v, want a timeout", res)
	}
	if out, _ := osexec.Command("pgrep", "-f", "sleep 30; touch late").Output(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("background process survived the timeout: pids %s", out)
	}
}

func TestFileToolsResolvePathsInTheWorkspace(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(env.Workspace, "out-link")); err != nil {
		t.Fatal(err)
	}
	s := Filter(Builtin(env), nil, nil)
	call := func(tool, args string) (string, error) {
		return s.Call(context.Background(), tool, json.RawMessage(args))
	}

	if _, err := call("write_file", `{"path": "notes/a.txt", "content": "hello"}`); err != nil {
		t.Fatalf("write_file: %v", err)
	}
	if got, err := call("read_file", `{"path": "notes/a.txt"}`); err != nil || got != "hello" {
		t.Errorf("read_file = %q, %v; want hello", got, err)
	}
	if got, err := call("list_dir", `{}`); err != nil || got != ".tmp/\nnotes/\nout-link\n" {
		t.Errorf("list_dir = %q, %v", got, err)
	}
	abs, _ := json.Marshal(map[string]string{"path": filepath.Join(env.Workspace, "notes/a.txt")})
	if got, err := call("read_file", string(abs)); err != nil || got != "hello" {
		t.Errorf("read_file with an absolute path = %q, %v; want hello", got, err)
	}
	for _, args := range []string{`{"path": "../x"}`, `{"path": "out-link/x", "content": "x"}`} {
		tool := "read_file"
		if strings.Contains(args, "content") {
			tool = "write_file"
		}
		if _, err := call(tool, args); err == nil || !strings.Contains(err.Error(), "outside the workspace") {
			t.Errorf("%s %s error = %v, want 'outside the workspace'", tool, args, err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Error("write_file followed a symlink out of the workspace")
	}
}
