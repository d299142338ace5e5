package hostrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

const providerKey = "sk-test-PROVIDER-KEY-must-not-leak"

type report struct {
	UID          int      `json:"uid"`
	GID          int      `json:"gid"`
	Groups       []int    `json:"groups"`
	Env          []string `json:"env"`
	Args         []string `json:"args"`
	Cwd          string   `json:"cwd"`
	Workspace    string   `json:"workspace"`
	Unrestricted bool     `json:"unrestricted"`
	Interfaces   []string `json:"interfaces"`
	NetNS        string   `json:"netns"`
}

func spec(t *testing.T, text string) isolation.Spec {
	t.Helper()
	runID := "run-" + strings.ReplaceAll(t.Name(), "/", "-")
	return isolation.Spec{Plan: isolation.Plan{RunID: runID, AgentID: "a", Workspace: workspace(t), AgentBinary: testAgent, RunAs: "nobody", Timeout: 30 * time.Second, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9}}, Request: agentproto.Request{
		Version:  agentproto.Version,
		RunID:    runID,
		Agent:    agentproto.Agent{ID: "a", MaxIterations: 1},
		Message:  agentproto.Message{ID: "m1", Text: text},
		Provider: agentproto.Provider{Name: "p", Kind: "openai", Key: providerKey},
	}}
}

func whoami(t *testing.T, res isolation.Result) report {
	t.Helper()
	var r report
	if err := json.Unmarshal([]byte(res.Response.Reply), &r); err != nil {
		t.Fatalf("cannot decode reply %q: %v", res.Response.Reply, err)
	}
	return r
}

func wantReason(t *testing.T, err error, reason string) *isolation.RunError {
	t.Helper()
	var re *isolation.RunError
	if !errors.As(err, &re) {
		t.Fatalf("got error %v, want a RunError with reason %q", err, reason)
	}
	if re.Reason != reason {
		t.Fatalf("got reason %q (%v), want %q", re.Reason, err, reason)
	}
	return re
}

func TestRunRoundTripsARequest(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "echo hello there")
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	if res.Response.Reply != "hello there" || res.Response.RunID != s.RunID || res.ExitCode != 0 {
		t.Fatalf("got %+v", res)
	}
}

func TestRunRunsAsTheRunAsUserInTheWorkspace(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	uid, gid := nobody(t)
	s := spec(t, "whoami")
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	r := whoami(t, res)
	if r.UID != uid || r.GID != gid {
		t.Errorf("agent ran as %d:%d, want nobody %d:%d", r.UID, r.GID, uid, gid)
	}
	if slices.Contains(r.Groups, 0) {
		t.Errorf("agent kept root's group: %v", r.Groups)
	}
	if r.Cwd != s.Workspace || r.Workspace != s.Workspace {
		t.Errorf("cwd %q, request workspace %q, want %q", r.Cwd, r.Workspace, s.Workspace)
	}
}

func TestRunRefusesRootUnlessAllowed(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	for _, runAs := range []string{"root", "0", ""} {
		s := spec(t, "whoami")
		s.RunAs = runAs
		_, err := hostrun.Runner{}.Run(context.Background(), s)
		wantReason(t, err, isolation.ReasonStart)
	}
	s := spec(t, "whoami")
	s.RunAs = "root"
	res, err := hostrun.Runner{AllowRoot: true}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run as root with AllowRoot failed: %v", err)
	}
	if r := whoami(t, res); r.UID != 0 {
		t.Errorf("agent ran as uid %d, want 0", r.UID)
	}
}

// Not parallel: it sets the scheduler's own environment.
func TestRunPassesOnlyTheMinimalEnvironment(t *testing.T) {
	requireRoot(t)
	t.Setenv("OPENAI_API_KEY", providerKey)
	t.Setenv("BERTH_SECRET_THING", "x")
	t.Setenv(hostrun.TestLandlockABIEnv, "2")
	s := spec(t, "whoami")
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v", err)
	}
	r := whoami(t, res)
	want := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + s.Workspace,
		"TMPDIR=/tmp",
		"LANG=C.UTF-8",
		hostrun.TestLandlockABIEnv + "=2",
	}
	got := slices.Clone(r.Env)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("environment is %q, want %q", got, want)
	}
	if !slices.Equal(r.Args, []string{testAgent}) {
		t.Errorf("argv is %q, want only the binary", r.Args)
	}
	if strings.Contains(res.Response.Reply, providerKey) {
		t.Errorf("provider key reached env or argv: %s", res.Response.Reply)
	}
}

func TestRunKeepsTheKeyOutOfProcEnvironAndCmdline(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "sleep")
	handles := make(chan string, 1)
	s.OnStart = func(h string) error { handles <- h; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := hostrun.Runner{}.Run(ctx, s)
		done <- err
	}()
	pid := handlePID(t, <-handles)
	waitForExec(t, pid, testAgent)
	for _, f := range []string{"environ", "cmdline"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			t.Fatalf("cannot read %s: %v", f, err)
		}
		if strings.Contains(string(data), providerKey) || strings.Contains(string(data), "PROVIDER") {
			t.Errorf("/proc/%d/%s holds the provider key: %q", pid, f, data)
		}
	}
	cancel()
	wantReason(t, <-done, isolation.ReasonCanceled)
}

func TestRunKillsTheWholeGroupOnTimeout(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "spawn")
	s.Timeout = time.Second
	start := time.Now()
	_, err := hostrun.Runner{}.Run(context.Background(), s)
	wantReason(t, err, isolation.ReasonTimeout)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("timeout took %s", d)
	}
	data, err := os.ReadFile(filepath.Join(s.Workspace, "child.pid"))
	if err != nil {
		t.Fatalf("agent did not spawn its child: %v", err)
	}
	child, _ := strconv.Atoi(string(data))
	waitGone(t, child)
}

func TestRunEndsWithCanceledWhenTheContextIsCanceled(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "sleep")
	ctx, cancel := context.WithCancel(context.Background())
	s.OnStart = func(string) error { time.AfterFunc(200*time.Millisecond, cancel); return nil }
	_, err := hostrun.Runner{}.Run(ctx, s)
	wantReason(t, err, isolation.ReasonCanceled)
}

func TestRunMapsExitCodesToReasons(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	tests := []struct {
		name, text, reason, detail string
		code                       int
	}{
		{"Crash_keeps_the_stderr_tail", "crash 7", isolation.ReasonCrashed, "panic: something broke", 7},
		{"Internal_error_without_response_is_a_crash", "crash 4", isolation.ReasonCrashed, "exit code 4", 4},
		{"Exit_3_is_a_confinement_failure", "confinement", isolation.ReasonConfinement, "landlock ABI too old", 3},
		{"Garbage_on_stdout_is_a_bad_response", "garbage", isolation.ReasonBadResponse, "", 0},
		{"Response_for_another_run_is_a_bad_response", "wrongrun", isolation.ReasonBadResponse, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := hostrun.Runner{}.Run(context.Background(), spec(t, tc.text))
			re := wantReason(t, err, tc.reason)
			if !strings.Contains(re.Error(), tc.detail) {
				t.Errorf("error %q does not mention %q", re.Error(), tc.detail)
			}
			if res.ExitCode != tc.code {
				t.Errorf("exit code %d, want %d", res.ExitCode, tc.code)
			}
			if len(res.Stderr) > hostrun.StderrTail {
				t.Errorf("kept %d bytes of stderr, want at most %d", len(res.Stderr), hostrun.StderrTail)
			}
		})
	}
}

func TestRunReturnsAnAgentErrorAsAResult(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	res, err := hostrun.Runner{}.Run(context.Background(), spec(t, "agenterror"))
	if err != nil {
		t.Fatalf("run failed: %v", err)
	}
	if res.ExitCode != agentproto.ExitAgentError || res.Response.Error != "max iterations reached" {
		t.Fatalf("got %+v", res)
	}
}

func TestRunCutsTheNetworkUnlessAllowed(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "whoami")
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v", err)
	}
	hostNS := hostNetNamespace(t)
	if got := whoami(t, res); !slices.Equal(got.Interfaces, []string{"lo"}) || got.NetNS == hostNS {
		t.Errorf("without network: interfaces %q in %s, want only lo in a namespace other than the host's %s", got.Interfaces, got.NetNS, hostNS)
	}

	s = spec(t, "whoami")
	s.Policy.Network = true
	res, err = hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v", err)
	}
	// The namespace, not its interfaces: other tests' containers add and
	// remove veths on the host while this one runs.
	if got := whoami(t, res).NetNS; got != hostNS {
		t.Errorf("network namespace with network: %s, want the host's %s", got, hostNS)
	}
}

func TestKillEndsARunningAgentAndIgnoresStaleHandles(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	type ended struct {
		res isolation.Result
		err error
	}
	start := func(s isolation.Spec) (handle string, done <-chan ended) {
		handles := make(chan string, 1)
		s.OnStart = func(h string) error { handles <- h; return nil }
		out := make(chan ended, 1)
		go func() {
			res, err := hostrun.Runner{}.Run(context.Background(), s)
			out <- ended{res, err}
		}()
		return <-handles, out
	}

	// The agent answers when sent SIGUSR1 after the stale handle's kill:
	// had that kill sent SIGKILL, which comes first, the run would crash.
	s := spec(t, "untilusr1")
	handle, done := start(s)
	pid := handlePID(t, handle)
	waitForFile(t, filepath.Join(s.Workspace, "ready"), nil)
	parts := strings.Split(handle, ":")
	st, _ := strconv.ParseUint(parts[2], 10, 64)
	if err := hostrun.Kill(context.Background(), hostrun.Handle(pid, st+1)); err != nil {
		t.Fatalf("kill of a stale handle failed: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatalf("cannot tell the agent to answer (did the stale handle kill it?): %v", err)
	}
	select {
	case e := <-done:
		if e.err != nil || e.res.Response.Reply != "released" {
			t.Fatalf("a stale handle killed the agent: %v (reply %q)", e.err, e.res.Response.Reply)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not answer after SIGUSR1")
	}

	handle, done = start(spec(t, "spawn"))
	waitForExec(t, handlePID(t, handle), testAgent)
	if err := hostrun.Kill(context.Background(), handle); err != nil {
		t.Fatalf("kill failed: %v", err)
	}
	select {
	case e := <-done:
		wantReason(t, e.err, isolation.ReasonCrashed)
	case <-time.After(10 * time.Second):
		t.Fatal("agent still runs after Kill")
	}
	if err := hostrun.Kill(context.Background(), handle); err != nil {
		t.Errorf("kill of a finished agent failed: %v", err)
	}
	if err := hostrun.Kill(context.Background(), "container:abc"); err == nil {
		t.Error("kill accepted a handle it cannot understand")
	}
}

func handlePID(t *testing.T, handle string) int {
	t.Helper()
	parts := strings.Split(handle, ":")
	if len(parts) != 3 || parts[0] != "pid" {
		t.Fatalf("handle %q is not pid:<pid>:<start>", handle)
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil {
		t.Fatalf("handle %q: %v", handle, err)
	}
	return pid
}

// waitForExec waits until pid runs binary (it is forked before it execs).
func waitForExec(t *testing.T, pid int, binary string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == binary {
			time.Sleep(50 * time.Millisecond)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d never ran %s", pid, binary)
}

// waitGone waits until pid no longer runs (gone or a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(data), ')'); i > 0 && strings.HasPrefix(string(data[i+1:]), " Z") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("child %d of the agent outlived the run", pid)
}

// hostNetNamespace names the test's own (the host's) network namespace.
func hostNetNamespace(t *testing.T) string {
	t.Helper()
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// A run whose handle cannot be recorded could not be killed after a
// scheduler crash: it is ended at once instead of left running.
func TestRunWhoseHandleCannotBeRecordedIsEndedAtOnce(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	s := spec(t, "sleep")
	handles := make(chan string, 1)
	s.OnStart = func(h string) error {
		handles <- h
		return errors.New("store refused the write")
	}
	begin := time.Now()
	_, err := hostrun.Runner{}.Run(context.Background(), s)
	re := wantReason(t, err, isolation.ReasonUntracked)
	if !strings.Contains(re.Error(), "store refused the write") {
		t.Errorf("error %q does not say why the handle was not recorded", re)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Errorf("the untracked run took %s to end", d)
	}
	waitGone(t, handlePID(t, <-handles))
}
