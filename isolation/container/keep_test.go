package container_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// startKept opens a kept container sandbox that the test stops at its end.
func startKept(t *testing.T, b *container.Backend, s isolation.Spec) isolation.Kept {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, s)
	if err != nil {
		t.Fatalf("cannot start the sandbox: %v", err)
	}
	t.Cleanup(func() { _ = k.Stop(context.Background(), 0) })
	return k
}

var keptRuns atomic.Int64

func keptRequest(text string) agentproto.Request {
	return agentproto.Request{
		RunID:   fmt.Sprintf("run-%d-%d", keptRuns.Add(1), os.Getpid()),
		Agent:   agentproto.Agent{ID: "tester", MaxIterations: 3},
		Message: agentproto.Message{ID: "m", Text: text},
	}
}

// keptShell runs "/sh command" as one request of k and returns the reply.
func keptShell(t *testing.T, k isolation.Kept, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := k.Run(ctx, keptRequest("/sh "+command))
	if err != nil {
		t.Fatalf("run %q failed: %v\nstderr: %s", command, err, res.Stderr)
	}
	return res.Response.Reply
}

// shellPid is the pid a "... & echo $!" command printed.
func shellPid(t *testing.T, reply string) int {
	t.Helper()
	for _, line := range strings.Split(reply, "\n") {
		if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && pid > 1 {
			return pid
		}
	}
	t.Fatalf("no pid in reply:\n%s", reply)
	return 0
}

func running(t *testing.T, cli *client.Client, run string) bool {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{Filters: make(client.Filters).Add("label", container.LabelRun+"="+run)})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items) > 0
}

// A conversation's second message finds what its first left in its
// container: a file in /tmp and a process started in the background.
func TestAKeptContainerKeepsItsTmpAndBackgroundProcessesBetweenRequests(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	s := spec(t, workspace(t), "", box{})
	k := startKept(t, b, s)

	// A heartbeat the background process writes shows it alive: Landlock
	// keeps one tool from signalling another's process, and /proc from both.
	keptShell(t, k, "echo kept-state > /tmp/state && sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/beat; sleep 0.1; done' >/dev/null 2>&1 & echo started")
	second := keptShell(t, k, "cat /tmp/state; a=$(cat /tmp/beat); sleep 0.5; b=$(cat /tmp/beat); [ \"$b\" -gt \"$a\" ] && echo alive; echo TMPDIR=$TMPDIR")
	for _, want := range []string{"kept-state", "alive", "TMPDIR=/tmp"} {
		if !slices.Contains(strings.Split(second, "\n"), want) {
			t.Errorf("second request's reply lacks the line %q:\n%s", want, second)
		}
	}
	mem, err := k.Memory(context.Background())
	if err != nil || mem <= 0 {
		t.Errorf("Memory = %d, %v; want the container's use", mem, err)
	}
	if err := k.Stop(context.Background(), 10*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Errorf("%d containers of the stopped sandbox are left", n)
	}
}

// Two kept containers see neither each other's /tmp nor processes.
func TestTwoKeptContainersCannotSeeEachOthersTmpOrProcesses(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	ws := workspace(t)
	a := startKept(t, b, spec(t, ws, "", box{}))
	other := startKept(t, b, spec(t, ws, "", box{}))

	keptShell(t, a, "echo only-a > /tmp/mine && sleep 314 >/dev/null 2>&1 & echo started")
	got := strings.Split(keptShell(t, other, "cat /tmp/mine 2>&1; echo done"), "\n")
	if slices.Contains(got, "only-a") || !slices.Contains(got, "done") {
		t.Errorf("the second sandbox reads the first one's /tmp:\n%s", strings.Join(got, "\n"))
	}
	// Which processes each sandbox holds, as the engine sees its PID
	// namespace: the first one's sleep is in it and only in it.
	if !holdsProcess(t, cli, a.Handle(), "sleep 314") {
		t.Fatalf("the first sandbox holds no sleep 314: the test proves nothing")
	}
	if holdsProcess(t, cli, other.Handle(), "sleep 314") {
		t.Errorf("the second sandbox's container holds the first one's sleep 314")
	}
}

// holdsProcess reports whether the container of a handle runs a process
// whose command line contains args.
func holdsProcess(t *testing.T, cli *client.Client, handle, args string) bool {
	t.Helper()
	top, err := cli.ContainerTop(context.Background(), strings.TrimPrefix(handle, "container:"), client.ContainerTopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range top.Processes {
		if strings.Contains(strings.Join(p, " "), args) {
			return true
		}
	}
	return false
}

// Stop is SIGTERM, grace, SIGKILL, and what the tools run gets the SIGTERM
// too: a sandbox whose processes end at SIGTERM is gone well within the
// grace; one with a process ignoring it ends only after the grace.
func TestStoppingAKeptContainerIsTermGraceKill(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	t.Run("Processes_that_end_at_SIGTERM_end_before_the_grace", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, cli)
		s := spec(t, workspace(t), "", box{})
		k := startKept(t, b, s)
		keptShell(t, k, "sleep 300 >/dev/null 2>&1 & echo $!")
		began := time.Now()
		if err := k.Stop(context.Background(), 30*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(began); took >= 30*time.Second {
			t.Errorf("Stop took %s: the full grace, as if SIGTERM had not reached the sleep", took)
		}
		if n := containersOf(t, cli, s.RunID); n != 0 {
			t.Errorf("%d containers of the stopped sandbox are left", n)
		}
	})
	t.Run("A_process_ignoring_SIGTERM_holds_it_until_the_grace_is_over", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, cli)
		s := spec(t, workspace(t), "", box{})
		k := startKept(t, b, s)
		keptShell(t, k, "sh -c 'trap \"\" TERM; while :; do sleep 1; done' >/dev/null 2>&1 & echo $!")
		const grace = 2 * time.Second
		began := time.Now()
		if err := k.Stop(context.Background(), grace); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(began); took < grace {
			t.Errorf("Stop took %s, less than its grace of %s, although a process ignored SIGTERM", took, grace)
		}
		if n := containersOf(t, cli, s.RunID); n != 0 {
			t.Errorf("%d containers of the stopped sandbox are left", n)
		}
	})
}

// keepHelperEnv makes the test binary a scheduler that opens a kept
// container, prints its handle and sandbox id and waits to be killed.
const keepHelperEnv = "BERTH_CONTAINER_KEEP_HELPER"

type keepHelperOutcome struct {
	Handle  string `json:"handle"`
	Sandbox string `json:"sandbox"`
	Error   string `json:"error,omitempty"`
}

// runKeepHelper is the helper scheduler's main.
func runKeepHelper() int {
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int { _ = out.Encode(keepHelperOutcome{Error: err.Error()}); return 1 }
	b, err := container.New(container.Options{Instance: os.Getenv("HELPER_INSTANCE")})
	if err != nil {
		return fail(err)
	}
	s := isolation.Spec{
		Plan: isolation.Plan{Backend: isolation.BackendContainer, RunID: os.Getenv("HELPER_SANDBOX"), AgentID: "tester",
			Workspace: os.Getenv("HELPER_WORKSPACE"), SandboxWorkspace: isolation.ContainerWorkspace, AgentBinary: os.Getenv("HELPER_AGENT"),
			RunAs: "nobody", Timeout: time.Minute, Policy: isolation.ContainerPolicy(false),
			Limits:  isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9, TmpfsBytes: 256 << 20},
			Network: isolation.Network{Mode: "none"},
			Mounts:  []isolation.Mount{{Source: os.Getenv("HELPER_WORKSPACE"), Target: isolation.ContainerWorkspace}}},
		Request: agentproto.Request{Version: agentproto.Version, RunID: os.Getenv("HELPER_SANDBOX"), Provider: agentproto.Provider{Name: "local", Kind: "local"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, s)
	if err != nil {
		return fail(err)
	}
	if _, err := k.Run(ctx, keptRequest("/sh sleep 300 >/dev/null 2>&1 & echo $!")); err != nil {
		return fail(err)
	}
	_ = out.Encode(keepHelperOutcome{Handle: k.Handle(), Sandbox: s.RunID})
	select {} // until the test kills this scheduler
}

// A scheduler that dies leaves its kept container running (its stdin stays
// open); Kill with the recorded handle, from a restarted scheduler's
// backend, removes it and everything in it.
func TestKillAfterTheOwnerVanishedLeavesNoKeptContainer(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sandbox := fmt.Sprintf("sbx%d", time.Now().UnixNano())
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), keepHelperEnv+"=1", "HELPER_INSTANCE="+instance(t), "HELPER_SANDBOX="+sandbox,
		"HELPER_WORKSPACE="+workspace(t), "HELPER_AGENT="+agentBinary)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got keepHelperOutcome
	derr := json.NewDecoder(bufio.NewReader(stdout)).Decode(&got)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if derr != nil || got.Error != "" {
		t.Fatalf("helper scheduler: %+v (%v)", got, derr)
	}
	t.Cleanup(func() { _ = newBackend(t, cli).Kill(context.Background(), got.Handle) })
	if !running(t, cli, sandbox) {
		t.Fatalf("the kept container ended with its scheduler: the test proves nothing")
	}

	restarted := newBackend(t, cli)
	if err := restarted.Kill(context.Background(), got.Handle); err != nil {
		t.Fatalf("Kill(%q): %v", got.Handle, err)
	}
	if n := containersOf(t, cli, sandbox); n != 0 {
		t.Errorf("%d containers of the sandbox are left after Kill", n)
	}
	if err := restarted.Kill(context.Background(), got.Handle); err != nil {
		t.Errorf("a second Kill of a gone sandbox: %v", err)
	}
}
