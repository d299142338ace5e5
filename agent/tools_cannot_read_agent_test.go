package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// keyNeedle is the provider key as a tool spells it: built by the shell,
// so the message text (which the agent also holds) does not contain it.
const keyNeedle = `"sk-provider-key-do-not-$(echo leak)"`

// runAs is who berth-agent runs as in a test.
type runAs struct {
	name     string
	uid, gid int
}

func users(t *testing.T) []runAs {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("cannot find user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return []runAs{{"nobody", uid, gid}, {"root", 0, 0}}
}

// openFixture is a workspace the run user owns, under a directory every
// user may enter, with the policy a host run gets: the system read set
// including the agent's own /proc/self, and the probe.
func openFixture(t *testing.T, as runAs) fixture {
	t.Helper()
	root, err := os.MkdirTemp(testDir, "run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	f := fixture{root: root, workspace: filepath.Join(root, "workspace")}
	writeFile(t, filepath.Join(f.workspace, "notes.txt"), "workspace notes\n")
	for _, p := range []string{root, f.workspace, filepath.Join(f.workspace, "notes.txt")} {
		if err := os.Chown(p, as.uid, as.gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f fixture) hostRequest(text string) agentproto.Request {
	req := f.request(text)
	req.Policy.AllowRead = append(req.Policy.AllowRead, "/proc/self", "/etc/passwd", "/etc/group", probeBinary)
	return req
}

// startAgent starts berth-agent as the given user with req on stdin.
func startAgent(t *testing.T, req agentproto.Request, as runAs) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	stdin, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBinary)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(as.uid), Gid: uint32(as.gid)}}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start berth-agent: %v", err)
	}
	return cmd, &stdout, &stderr
}

func runAgentAs(t *testing.T, req agentproto.Request, as runAs) result {
	t.Helper()
	cmd, stdout, stderr := startAgent(t, req, as)
	err := cmd.Wait()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		res.code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("berth-agent failed: %v", err)
	}
	if err := json.Unmarshal(stdout.Bytes(), &res.resp); err != nil {
		t.Fatalf("stdout is not a response: %v\n%s\nstderr: %s", err, res.stdout, res.stderr)
	}
	if strings.Contains(res.stdout+res.stderr, "sk-provider-key-do-not-leak") {
		t.Errorf("the provider key leaked into stdout or stderr:\n%s\n%s", res.stdout, res.stderr)
	}
	return res
}

func TestToolsCannotReadOrTraceTheAgent(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)

	tests := []struct {
		name    string
		command string
		refused []string // each must be in the reply
		never   []string // none may be in the reply
	}{
		{
			name:    "Reading_the_agents_memory_finds_no_key",
			command: "probe mem $PPID " + keyNeedle,
			refused: []string{"refused", "[exit code 1]"},
			never:   []string{"needle found"},
		},
		{
			name:    "Ptrace_attach_to_the_agent_and_its_threads_is_refused",
			command: "probe ptrace $PPID",
			refused: []string{"ptrace attach to", "refused", "[exit code 1]"},
			never:   []string{"succeeded"},
		},
		{
			name:    "The_agents_environ_is_unreadable",
			command: "cat /proc/$PPID/environ",
			refused: []string{"/environ: Permission denied", "[exit code 1]"},
		},
		{
			name:    "The_agents_stdin_is_unreadable",
			command: "cat /proc/$PPID/fd/0; ls /proc/$PPID/fd",
			refused: []string{"/fd/0: Permission denied", "/fd': Permission denied"},
		},
		{
			name:    "The_agents_cmdline_and_status_are_unreadable",
			command: "cat /proc/$PPID/cmdline /proc/$PPID/status",
			refused: []string{"/cmdline: Permission denied", "/status: Permission denied"},
		},
		{
			name:    "Ordinary_commands_still_work_in_the_workspace",
			command: "ls; cat notes.txt; echo written > new.txt && cat new.txt && mktemp",
			refused: []string{"notes.txt\n", "workspace notes\nwritten\n", "/.tmp/tmp.", "[exit code 0]"},
		},
	}
	for _, as := range users(t) {
		for _, tc := range tests {
			t.Run(as.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				f := openFixture(t, as)
				cmd := strings.ReplaceAll(tc.command, "probe ", probeBinary+" ")
				res := runAgentAs(t, f.hostRequest("/sh "+cmd), as)
				res.expect(t, agentproto.ExitOK, tc.refused...)
				for _, s := range tc.never {
					if strings.Contains(res.resp.Reply, s) {
						t.Errorf("a tool got into the agent (%q):\n%s", s, res.resp.Reply)
					}
				}
			})
		}
	}
}

// TestTheAgentIsNotDumpable attacks a running agent from outside its
// sandbox, as a process of its own uid: only the dumpable flag stands in
// the way there.
func TestTheAgentIsNotDumpable(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	nobody := users(t)[0]
	f := openFixture(t, nobody)
	started, finish := filepath.Join(f.workspace, "started"), filepath.Join(f.workspace, "finish")
	req := f.hostRequest(fmt.Sprintf("/sh touch %s; while [ ! -e %s ]; do sleep 0.05; done; echo finished", started, finish))
	cmd, stdout, stderr := startAgent(t, req, nobody)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tool never started\nstdout: %s\nstderr: %s", stdout, stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}

	pid := strconv.Itoa(cmd.Process.Pid)
	asNobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(nobody.uid), Gid: uint32(nobody.gid)}}
	for _, attack := range [][]string{
		{probeBinary, "mem", pid, "sk-provider-key-do-not-leak"},
		{probeBinary, "ptrace", pid},
		{"/bin/cat", "/proc/" + pid + "/environ"},
	} {
		c := exec.Command(attack[0], attack[1:]...)
		c.SysProcAttr = asNobody
		out, err := c.CombinedOutput()
		if err == nil || bytes.Contains(out, []byte("needle found")) || bytes.Contains(out, []byte("succeeded")) {
			t.Errorf("%s as the agent's uid got in (err %v):\n%s", filepath.Base(attack[0])+" "+attack[1], err, out)
		}
	}

	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("berth-agent failed: %v\nstderr: %s", err, stderr)
	}
	if !strings.Contains(stdout.String(), "finished") {
		t.Errorf("the run did not finish its tool:\n%s", stdout)
	}
}

func TestToolOutputWithNULAndInvalidUTF8GivesADeliverableResponse(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	f := newFixture(t)
	res := runAgent(t, f.request(`/sh printf 'a\0b\377c'; printf 'err\0or' >&2`))
	res.expect(t, agentproto.ExitOK, "a\uFFFDb\uFFFDc", "err\uFFFDor")
	if strings.Contains(res.stdout, `\u0000`) || !utf8.ValidString(res.stdout) {
		t.Errorf("the response carries NUL or invalid UTF-8:\n%q", res.stdout)
	}
	texts := []string{res.resp.Reply, res.resp.Error}
	for _, c := range res.resp.ToolCalls {
		texts = append(texts, c.Output, c.Error, string(c.Args))
	}
	for _, s := range texts {
		if strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
			t.Errorf("response text is not deliverable: %q", s)
		}
	}
}

func TestInProcessToolsRefuseTheAgentsOwnProcEntry(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	f := newFixture(t)
	req := f.request(`/tool read_file {"path": "/proc/self/environ"}`)
	req.Policy.AllowRead = append(req.Policy.AllowRead, "/proc/self")
	runAgent(t, req).expect(t, agentproto.ExitOK, "[read_file error]", "is berth-agent's own /proc entry")
}

func TestTheToolLauncherRefusesToRunWithoutARuleset(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(agentBinary, confine.ToolLauncherArg, "0", "/bin/echo", "echo", "ran")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != confine.LaunchRefused {
		t.Fatalf("launcher without a ruleset: %v, want exit code %d", err, confine.LaunchRefused)
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "no Landlock ruleset on fd 3") {
		t.Errorf("stdout %q, stderr %q: want nothing run and the reason", stdout.String(), stderr.String())
	}
}

// Before Landlock ABI 8 each thread of the agent has its own domain, and a
// scoped domain can only signal what lies beneath it: the kill at a timeout
// must come from the thread the tool was forked from.
func TestATimeoutKillsEveryProcessOfAConfinedTool(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	nobody := users(t)[0]
	for i := range 3 { // which thread sends the kill varies from run to run
		t.Run(fmt.Sprintf("Run_%d", i+1), func(t *testing.T) {
			t.Parallel()
			f := openFixture(t, nobody)
			res := runAgentAs(t, f.hostRequest(`/tool shell {"command": "sleep 60 & echo $! > bg.pid; sleep 60", "timeout": 1}`), nobody)
			res.expect(t, agentproto.ExitOK, "timed out after 1s", "[exit code 137]")
			data, err := os.ReadFile(filepath.Join(f.workspace, "bg.pid"))
			if err != nil {
				t.Fatal(err)
			}
			bg := strings.TrimSpace(string(data))
			for deadline := time.Now().Add(10 * time.Second); alive(bg); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("background process %s of the timed-out tool is still running", bg)
				}
			}
		})
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
