package hostrun_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// keptSpec is a kept landlock sandbox of the real berth-agent with the
// local provider.
func keptSpec(t *testing.T) isolation.Spec {
	t.Helper()
	s := landlockSpec(t, "")
	s.RunID = "sbx-" + strings.ReplaceAll(t.Name(), "/", "-")
	s.Request.RunID = s.RunID
	return s
}

// startKept opens a kept sandbox that the test stops at its end.
func startKept(t *testing.T, s isolation.Spec) isolation.Kept {
	t.Helper()
	k, err := hostrun.Runner{}.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("cannot start the sandbox: %v", err)
	}
	t.Cleanup(func() { _ = k.Stop(context.Background(), 0) })
	return k
}

var keptRuns atomic.Int64

// shell runs "/sh command" as one request of k and returns the reply.
func shell(t *testing.T, k isolation.Kept, command string) string {
	t.Helper()
	res, err := k.Run(context.Background(), agentproto.Request{
		RunID:   "run-" + strconv.FormatInt(keptRuns.Add(1), 10) + "-" + strconv.Itoa(os.Getpid()),
		Agent:   agentproto.Agent{ID: "a", MaxIterations: 2},
		Message: agentproto.Message{ID: "m", Text: "/sh " + command},
	})
	if err != nil {
		t.Fatalf("run %q failed: %v\nstderr: %s", command, err, res.Stderr)
	}
	return res.Response.Reply
}

// backgroundPid is the pid a "... & echo $!" command printed.
func backgroundPid(t *testing.T, reply string) int {
	t.Helper()
	for _, line := range strings.Split(reply, "\n") {
		if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && pid > 1 {
			return pid
		}
	}
	t.Fatalf("no pid in reply:\n%s", reply)
	return 0
}

// A conversation's second message finds what its first left: a file in
// the sandbox's /tmp and a process a tool started in the background.
func TestAKeptSandboxKeepsItsTmpAndBackgroundProcessesBetweenRequests(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	k := startKept(t, keptSpec(t))

	first := shell(t, k, "echo kept-state > /tmp/state && sleep 300 >/dev/null 2>&1 & echo $!")
	pid := backgroundPid(t, first)
	second := shell(t, k, "cat /tmp/state; kill -0 "+strconv.Itoa(pid)+" && echo alive; echo TMPDIR=$TMPDIR")
	for _, want := range []string{"kept-state", "alive", "TMPDIR=/tmp"} {
		if !strings.Contains(second, want) {
			t.Errorf("second request's reply lacks %q:\n%s", want, second)
		}
	}
	if _, err := os.Stat("/tmp/state"); err == nil {
		t.Errorf("the sandbox's /tmp/state is in the host's /tmp")
	}
	if k.Runs() != 2 {
		t.Errorf("Runs = %d, want 2", k.Runs())
	}
	if err := k.Stop(context.Background(), 5*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !gone(pid) {
		t.Errorf("the background process %d outlived its sandbox", pid)
	}
}

// Two live sandboxes of one agent (same user) see neither each other's
// /tmp nor each other's processes.
func TestTwoKeptSandboxesCannotSeeEachOthersTmpOrProcesses(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	first := keptSpec(t)
	second := first
	second.RunID, second.Request.RunID = first.RunID+"-2", first.RunID+"-2"
	a, b := startKept(t, first), startKept(t, second)

	pid := backgroundPid(t, shell(t, a, "echo only-a > /tmp/mine && sleep 300 >/dev/null 2>&1 & echo $!"))
	got := shell(t, b, "cat /tmp/mine 2>&1; ls /proc/"+strconv.Itoa(pid)+" >/dev/null 2>&1 && echo sees-proc; kill -0 "+strconv.Itoa(pid)+" 2>/dev/null && echo can-signal; echo done")
	lines := strings.Split(got, "\n")
	for _, leak := range []string{"only-a", "sees-proc", "can-signal"} {
		if slices.Contains(lines, leak) {
			t.Errorf("the second sandbox reaches the first one's %q:\n%s", leak, got)
		}
	}
	if !slices.Contains(lines, "done") {
		t.Errorf("the second sandbox's command did not run to its end:\n%s", got)
	}
}

// Stop is SIGTERM, grace, SIGKILL: a sandbox whose processes end at
// SIGTERM is gone well within the grace; a process ignoring SIGTERM holds
// it until the grace is over and is then killed.
func TestStoppingAKeptSandboxIsTermGraceKill(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	t.Run("Processes_that_end_at_SIGTERM_end_before_the_grace", func(t *testing.T) {
		t.Parallel()
		k := startKept(t, keptSpec(t))
		pid := backgroundPid(t, shell(t, k, "sleep 300 >/dev/null 2>&1 & echo $!"))
		began := time.Now()
		if err := k.Stop(context.Background(), 30*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(began); took >= 30*time.Second {
			t.Errorf("Stop took %s: the full grace, as if SIGTERM had not been sent", took)
		}
		if !gone(pid) {
			t.Errorf("process %d outlived its sandbox", pid)
		}
	})
	t.Run("A_process_ignoring_SIGTERM_is_killed_after_the_grace", func(t *testing.T) {
		t.Parallel()
		k := startKept(t, keptSpec(t))
		// The reply waits until the trap is set: a TERM that reached the
		// shell before it ran trap ended it, and Stop with it (under load).
		pid := backgroundPid(t, shell(t, k, "sh -c 'trap \"\" TERM; : > trapped; while :; do sleep 1; done' >/dev/null 2>&1 & echo $!; while [ ! -e trapped ]; do sleep 0.01; done"))
		const grace = 1500 * time.Millisecond
		began := time.Now()
		if err := k.Stop(context.Background(), grace); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(began); took < grace {
			t.Errorf("Stop took %s, less than its grace of %s, although a process ignored SIGTERM", took, grace)
		}
		if !gone(pid) {
			t.Errorf("process %d, which ignores SIGTERM, outlived its sandbox", pid)
		}
		select {
		case <-k.Done():
		default:
			t.Errorf("Done is not closed after Stop")
		}
	})
}

// keepHelperEnv makes the test binary a scheduler that opens a kept
// sandbox, starts a background process in it, prints both and waits to be
// killed.
const keepHelperEnv = "BERTH_HOSTRUN_KEEP_HELPER"

type keepHelperOutcome struct {
	Handle string `json:"handle"`
	Pid    int    `json:"pid"`
	Error  string `json:"error,omitempty"`
}

func runKeepHelper() int {
	ws := os.Getenv("HELPER_WORKSPACE")
	s := isolation.Spec{Plan: isolation.Plan{RunID: "sbx-orphan", Workspace: ws, AgentBinary: os.Getenv("HELPER_AGENT"), RunAs: "nobody", Timeout: 30 * time.Second,
		Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9}, Policy: isolation.HostPolicy(isolation.FileAccess{}, ws, nil)},
		Request: agentproto.Request{Version: agentproto.Version, RunID: "sbx-orphan", Provider: agentproto.Provider{Name: "local", Kind: "local"}}}
	out := json.NewEncoder(os.Stdout)
	k, err := hostrun.Runner{}.Start(context.Background(), s)
	if err != nil {
		_ = out.Encode(keepHelperOutcome{Error: err.Error()})
		return 1
	}
	res, err := k.Run(context.Background(), agentproto.Request{RunID: "r1", Agent: agentproto.Agent{ID: "a", MaxIterations: 2},
		Message: agentproto.Message{Text: "/sh setsid sleep 300 >/dev/null 2>&1 & echo $!"}})
	if err != nil {
		_ = out.Encode(keepHelperOutcome{Error: err.Error()})
		return 1
	}
	pid := 0
	for _, line := range strings.Split(res.Response.Reply, "\n") {
		if n, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && n > 1 {
			pid = n
		}
	}
	_ = out.Encode(keepHelperOutcome{Handle: k.Handle(), Pid: pid})
	select {} // until the test kills this scheduler
}

// A scheduler that dies leaves its kept sandbox's agent dead (Pdeathsig)
// but what its tools started lives on in the sandbox's cgroup; Kill with
// the recorded handle ends it and removes the cgroup: nothing is left.
func TestKillAfterTheOwnerVanishedLeavesNothingOfAKeptSandbox(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	testenvNeedAgent(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{keepHelperEnv + "=1", "HELPER_WORKSPACE=" + workspace(t), "HELPER_AGENT=" + berthAgent}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got keepHelperOutcome
	if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&got); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("no outcome from the helper scheduler: %v", err)
	}
	if got.Error != "" || got.Pid == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper scheduler: %+v", got)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	dirs := hostrun.KeptCgroupDirs(t, got.Handle)
	if len(dirs) == 0 {
		t.Fatalf("handle %q names no cgroup", got.Handle)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("the sandbox's cgroup %s is not there before Kill (%v): the test proves nothing", d, err)
		}
	}
	if gone(got.Pid) {
		t.Fatalf("the background process %d died with its scheduler: the test proves nothing", got.Pid)
	}

	if err := hostrun.Kill(context.Background(), got.Handle); err != nil {
		t.Fatalf("Kill(%q): %v", got.Handle, err)
	}
	if !gone(got.Pid) {
		t.Errorf("the background process %d survived Kill", got.Pid)
	}
	wantCgroupsGone(t, dirs)
	if err := hostrun.Kill(context.Background(), got.Handle); err != nil {
		t.Errorf("a second Kill of a gone sandbox: %v", err)
	}
}

func testenvNeedAgent(t *testing.T) {
	t.Helper()
	if berthAgentBuild != nil {
		t.Fatalf("cannot build berth-agent: %v", berthAgentBuild)
	}
	if _, err := os.Stat(filepath.Clean(berthAgent)); errors.Is(err, os.ErrNotExist) {
		t.Fatalf("berth-agent %s is missing", berthAgent)
	}
}

// A request past the plan's timeout fails with "timeout" and stops its
// sandbox: what the agent was doing is unknown, so it takes no further
// request, and nothing of it is left.
func TestAKeptRequestPastItsTimeoutStopsTheSandbox(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	s := keptSpec(t)
	s.Timeout = 2 * time.Second
	k := startKept(t, s)
	pid := backgroundPid(t, shell(t, k, "sleep 300 >/dev/null 2>&1 & echo $!"))
	_, err := k.Run(context.Background(), agentproto.Request{RunID: "run-slow", Agent: agentproto.Agent{ID: "a", MaxIterations: 2},
		Message: agentproto.Message{Text: "/sh sleep 60"}})
	wantReason(t, err, isolation.ReasonTimeout)
	select {
	case <-k.Done():
	default:
		t.Fatalf("the sandbox still takes requests after a timed-out one")
	}
	if !gone(pid) {
		t.Errorf("process %d of the timed-out sandbox is still running", pid)
	}
	if _, err := k.Run(context.Background(), agentproto.Request{RunID: "run-after", Message: agentproto.Message{Text: "hi"}}); isolation.ReasonOf(err) != isolation.ReasonCrashed {
		t.Errorf("a request to the stopped sandbox: %v, want it refused as ended", err)
	}
}

// Activity is every request, and what the owner reports with Touch (its
// egress proxy's decisions); an older report does not move it back. The
// sandbox's memory is its cgroup's.
func TestAKeptSandboxReportsActivityAndMemory(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	k := startKept(t, keptSpec(t))
	before := k.LastActivity()
	shell(t, k, "true")
	afterRun := k.LastActivity()
	if !afterRun.After(before) {
		t.Errorf("LastActivity %v did not move past %v with a request", afterRun, before)
	}
	later := afterRun.Add(time.Minute)
	k.Touch(later)
	k.Touch(afterRun.Add(-time.Hour))
	if got := k.LastActivity(); !got.Equal(later) {
		t.Errorf("LastActivity = %v after Touch(%v) and an older Touch, want %v", got, later, later)
	}
	if mem, err := k.Memory(context.Background()); err != nil || mem <= 0 {
		t.Errorf("Memory = %d, %v; want the cgroup's use", mem, err)
	}
}
