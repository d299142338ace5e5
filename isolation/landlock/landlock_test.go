package landlock_test

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// base is a 0755 directory user nobody can enter; the binaries live in it.
var base, testAgent, berthAgent string

// berthAgentBuild says why the real berth-agent could not be built, if so.
var berthAgentBuild error

func TestMain(m *testing.M) {
	var err error
	if base, err = testenv.OpenDir("berth-landlock-"); err == nil {
		testAgent, err = testenv.Build(base, "testagent", "../hostrun/testdata/testagent")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(base)
		os.Exit(1)
	}
	berthAgent, berthAgentBuild = testenv.Build(base, "berth-agent", "github.com/berth-dev/berth/cmd/berth-agent")
	code := m.Run()
	os.RemoveAll(base)
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
}

// mkdirNobody makes dir (and parents) 0755, owned by nobody when own is set.
func mkdirNobody(t *testing.T, dir string, own bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if !own {
		return
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("cannot find user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func spec(t *testing.T, binary, text string) isolation.Spec {
	t.Helper()
	ws, err := os.MkdirTemp(base, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	mkdirNobody(t, ws, true)
	runID := "run-" + strings.ReplaceAll(t.Name(), "/", "-")
	return isolation.Spec{Plan: isolation.Plan{RunID: runID, AgentID: "a", Workspace: ws, AgentBinary: binary, RunAs: "nobody", Timeout: 30 * time.Second, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9}}, Request: agentproto.Request{
		Version:  agentproto.Version,
		RunID:    runID,
		Agent:    agentproto.Agent{ID: "a", MaxIterations: 2},
		Message:  agentproto.Message{ID: "m1", Text: text},
		Provider: agentproto.Provider{Name: "local", Kind: "local", Key: "sk-local-key"},
	}}
}

func TestLandlockBackendRunsTheAgentAsTheRunAsUser(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	res, err := landlock.New().Run(context.Background(), spec(t, testAgent, "whoami"))
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	u, _ := user.Lookup("nobody")
	if !strings.Contains(res.Response.Reply, `"uid":`+u.Uid+",") {
		t.Errorf("reply %s does not show uid %s", res.Response.Reply, u.Uid)
	}
}

func TestLandlockBackendRefusesRootAndUnconfinedRuns(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	tests := []struct {
		name   string
		edit   func(*isolation.Spec)
		reason string
	}{
		{"Run_as_root_is_refused", func(s *isolation.Spec) { s.RunAs = "root" }, isolation.ReasonStart},
		{"Run_as_uid_0_is_refused", func(s *isolation.Spec) { s.RunAs = "0" }, isolation.ReasonStart},
		{"Empty_run_as_under_a_root_scheduler_is_refused", func(s *isolation.Spec) { s.RunAs = "" }, isolation.ReasonStart},
		{"Unrestricted_policy_is_refused", func(s *isolation.Spec) { s.Policy.Unrestricted = true }, isolation.ReasonConfinement},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := spec(t, testAgent, "whoami")
			started := false
			s.OnStart = func(string) error { started = true; return nil }
			tc.edit(&s)
			_, err := landlock.New().Run(context.Background(), s)
			if got := isolation.ReasonOf(err); got != tc.reason {
				t.Fatalf("got reason %q (%v), want %q", got, err, tc.reason)
			}
			if started {
				t.Error("the agent was started")
			}
		})
	}
}

// The real berth-agent, confined by the policy HostPolicy computes: it may
// write its workspace and run /bin/sh, and read nothing of berth's other
// state even inside a directory the admin allowed.
func TestLandlockBackendConfinesTheRealBerthAgent(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	root, err := os.MkdirTemp(base, "host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	mkdirNobody(t, root, false)
	state := filepath.Join(root, "state")
	configDir := filepath.Join(root, "etc-berth")
	own := filepath.Join(state, "agents", "a")
	other := filepath.Join(state, "agents", "b")
	mkdirNobody(t, own, true)
	mkdirNobody(t, other, true)
	mkdirNobody(t, configDir, false)
	for _, f := range []string{filepath.Join(other, "notes.txt"), filepath.Join(configDir, "berth.toml"), filepath.Join(state, "scheduler.db")} {
		if err := os.WriteFile(f, []byte("secret\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	s := spec(t, berthAgent, "")
	s.Workspace = own
	s.Request.Workspace = own
	// The admin allows reading the whole tree: only Deny keeps berth's state,
	// config and the other agent's workspace out.
	a := isolation.FileAccess{AllowRead: []string{root}}
	s.Policy = isolation.HostPolicy(a, own, []string{configDir, state})
	s.Request.Message.Text = "/sh id -u; echo hi > out.txt && cat out.txt; " +
		"cat " + filepath.Join(other, "notes.txt") + " " + filepath.Join(configDir, "berth.toml") + " " +
		filepath.Join(state, "scheduler.db") + " /etc/shadow 2>&1 | sed 's/^/denied? /'"
	res, err := landlock.New().Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v\nstderr: %s", err, res.Stderr)
	}
	reply := res.Response.Reply
	u, _ := user.Lookup("nobody")
	for _, want := range []string{"\n" + u.Uid + "\n", "\nhi\n", "[exit code 0]"} {
		if !strings.Contains(reply, want) {
			t.Errorf("reply lacks %q:\n%s", want, reply)
		}
	}
	if strings.Contains(reply, "secret") || strings.Contains(reply, "root:") {
		t.Errorf("the agent read something it must not:\n%s", reply)
	}
	if got := strings.Count(reply, "Permission denied"); got != 4 {
		t.Errorf("%d of 4 reads were denied:\n%s", got, reply)
	}
}

// A timed-out run must not leave its tools running: the shell tool puts each
// command in a process group of its own, yet the whole session goes.
func TestTimeoutEndsEveryToolTheAgentStarted(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	root, err := os.MkdirTemp(base, "timeout-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	mkdirNobody(t, root, false)
	ws := filepath.Join(root, "ws")
	mkdirNobody(t, ws, true)

	s := spec(t, berthAgent, "")
	s.Workspace, s.Request.Workspace = ws, ws
	s.Policy = isolation.HostPolicy(isolation.FileAccess{}, ws, nil)
	s.Request.Message.Text = "/sh sleep 3; echo late > late.txt"
	s.Timeout = time.Second
	_, err = landlock.New().Run(context.Background(), s)
	if isolation.ReasonOf(err) != isolation.ReasonTimeout {
		t.Fatalf("run ended with %v, want a timeout", err)
	}
	time.Sleep(3 * time.Second) // the tool would have written by now
	if _, err := os.Stat(filepath.Join(ws, "late.txt")); err == nil {
		t.Fatal("a tool of the timed-out run kept running and wrote late.txt")
	}
}
