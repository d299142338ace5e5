package hostrun_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/landlock"
)

// needCgroups skips (fails under CI) where runs would not get a cgroup of
// their own: under systemd they are transient units instead, and without a
// writable cgroup they fail closed.
func needCgroups(t *testing.T) {
	t.Helper()
	requireRoot(t)
	testenv.Need(t, !hostrun.SystemdAvailable(), "this test needs a machine where systemd is not PID 1")
	dirs, _ := hostrun.RunCgroups("probe")
	testenv.Need(t, dirs != nil, "this test needs a writable cgroup (v1 memory and pids, or v2 with both delegated)")
}

// landlockSpec is a landlock run of the real berth-agent with the local
// provider, which runs text's "/sh COMMAND" through the shell tool.
func landlockSpec(t *testing.T, text string) isolation.Spec {
	t.Helper()
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	s := spec(t, text)
	s.AgentBinary = berthAgent
	s.Request.Workspace = s.Workspace
	s.Request.Agent.MaxIterations = 2
	s.Request.Provider = agentproto.Provider{Name: "local", Kind: "local", Key: "sk-local-key"}
	s.Policy = isolation.HostPolicy(isolation.FileAccess{}, s.Workspace, nil)
	return s
}

// gone reports whether the process pid no longer runs (a zombie only waits
// to be reaped).
func gone(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] == 'Z'
}

// wantCgroupsGone fails when a run cgroup is still there. A cgroup can only
// be removed once no process is left in it, so this also proves the run
// left nothing behind in it.
func wantCgroupsGone(t *testing.T, dirs []string) {
	t.Helper()
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the run's cgroup %s is still there after the run (%v)", d, err)
		}
	}
}

// A memory hog that stays under the limit in every process (RLIMIT_DATA's
// view) but not together is what the per-run cgroup is for.
func TestAMemoryHogOfSeveralProcessesEndsTheRunWithOutOfMemory(t *testing.T) {
	// Not parallel: the rlimit row narrows the package's cgroup choice.
	needCgroups(t)
	hog := "/sh for i in 1 2 3 4; do (head -c 96M /dev/zero | tail | sleep 5) & done; wait; echo all four held their 96 MiB"
	tests := []struct {
		name    string
		rlimits bool
		reason  string
	}{
		{"In_its_cgroup_the_run_is_killed_at_256_MiB_and_ends_with_out_of_memory", false, isolation.ReasonOutOfMemory},
		{"With_only_rlimits_the_same_hog_outgrows_the_limit_and_succeeds", true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := landlockSpec(t, hog)
			// 256 MiB: under RLIMIT_DATA the agent's own thread stacks count too.
			s.Limits = isolation.Limits{MemoryBytes: 256 << 20, Pids: 256, NanoCPUs: 1e9}
			if tc.rlimits {
				hostrun.OnlyCgroupsUnder(t, "/nonexistent")
				s.Limits.RlimitFallback = true
			}
			res, err := landlock.New().Run(context.Background(), s)
			if got := isolation.ReasonOf(err); got != tc.reason {
				t.Fatalf("run ended with %q (%v), want %q\nreply: %s\nstderr: %s", got, err, tc.reason, res.Response.Reply, res.Stderr)
			}
			if tc.reason == "" && !strings.Contains(res.Response.Reply, "all four held") {
				t.Errorf("the hog did not get its memory under rlimits:\n%s", res.Response.Reply)
			}
		})
	}
}

func TestAForkBombIsHeldAtPidsMaxAndTheNextRunWorks(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	const pids = 64
	// Once the bomb holds every pid the tool's shell must need no fork to
	// keep the run going: it forks once, before the bomb exists, and execs
	// sleep. (dash forks each member of "b | b &" itself: under load the
	// first filled pids.max before the second fork, which failed, and the
	// shell exited, ending the run.)
	s := landlockSpec(t, "/sh (b(){ b | b & }; b) & exec sleep 60")
	s.Limits = isolation.Limits{MemoryBytes: 512 << 20, Pids: pids, NanoCPUs: 1e9}
	dirs, _ := hostrun.RunCgroups(s.RunID)
	var pidsDir string
	for _, d := range dirs {
		// The run's cgroup in the hierarchy that has pids.max.
		if _, err := os.Stat(filepath.Join(filepath.Dir(d), "pids.max")); err == nil || len(dirs) == 1 {
			pidsDir = d
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	s.OnStart = func(string) error { close(started); return nil }
	done := make(chan error, 1)
	go func() {
		_, err := landlock.New().Run(ctx, s)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the run ended before it started: %v", err)
	}
	// Wait for the kernel to refuse a fork at pids.max.
	deadline := time.Now().Add(30 * time.Second)
	for refused := uint64(0); refused == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the fork bomb never reached pids.max")
		}
		select {
		case err := <-done:
			// The run's cgroup goes with the run: say why it ended rather
			// than that pids.events is missing.
			t.Fatalf("the run ended before the fork bomb reached pids.max: %v", err)
		default:
		}
		if _, err := os.Stat(filepath.Join(pidsDir, "pids.events")); err != nil {
			time.Sleep(20 * time.Millisecond)
			continue // gone with an ended run: the select above says so
		}
		refused = readCount(t, filepath.Join(pidsDir, "pids.events"), "max")
		time.Sleep(20 * time.Millisecond)
	}
	current := readNumber(t, filepath.Join(pidsDir, "pids.current"))
	if current > pids {
		t.Errorf("the run has %d tasks, over pids.max %d", current, pids)
	}
	cancel()
	if err := <-done; isolation.ReasonOf(err) != isolation.ReasonCanceled {
		t.Fatalf("run ended with %v, want canceled", err)
	}
	wantCgroupsGone(t, dirs)

	next := landlockSpec(t, "/sh echo the next run works")
	next.RunID = s.RunID + "-next"
	next.Request.RunID = next.RunID
	res, err := landlock.New().Run(context.Background(), next)
	if err != nil {
		t.Fatalf("the run after the fork bomb failed: %v\nstderr: %s", err, res.Stderr)
	}
	if !strings.Contains(res.Response.Reply, "the next run works") {
		t.Errorf("reply %q", res.Response.Reply)
	}
}

func TestNoProcessOfARunOutlivesIt(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	tests := []struct {
		name    string
		spec    func(t *testing.T) isolation.Spec
		pidFile string
		reason  string
	}{
		{"A_tool_that_left_the_agents_session_is_killed_when_the_run_succeeds", func(t *testing.T) isolation.Spec {
			// The tool waits for the file "checked", which the test writes
			// once it saw the agent in its cgroups: an agent that already
			// exited is in none.
			return landlockSpec(t, "/sh setsid sleep 300 > sleeper.out 2>&1 & echo $! > sleeper.pid; while [ ! -e checked ]; do sleep 0.05; done")
		}, "sleeper.pid", ""},
		{"A_child_of_a_timed_out_run_is_killed", func(t *testing.T) isolation.Spec {
			s := spec(t, "spawn")
			s.Timeout = time.Second
			return s
		}, "child.pid", isolation.ReasonTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.spec(t)
			dirs, _ := hostrun.RunCgroups(s.RunID)
			inCgroup := make(chan error, 1)
			s.OnStart = func(h string) error {
				inCgroup <- agentIn(h, dirs)
				return os.WriteFile(filepath.Join(s.Workspace, "checked"), nil, 0o644)
			}
			res, err := hostrun.Runner{}.Run(context.Background(), s)
			if got := isolation.ReasonOf(err); got != tc.reason {
				t.Fatalf("run ended with %q (%v), want %q\nstderr: %s", got, err, tc.reason, res.Stderr)
			}
			if err := <-inCgroup; err != nil {
				t.Error(err)
			}
			data, err := os.ReadFile(filepath.Join(s.Workspace, tc.pidFile))
			if err != nil {
				t.Fatalf("the run wrote no pid: %v (reply %q)", err, res.Response.Reply)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				t.Fatalf("bad pid %q", data)
			}
			if !gone(pid) {
				t.Errorf("process %d of the run still runs after it", pid)
			}
			wantCgroupsGone(t, dirs)
		})
	}
}

// agentIn checks that the agent (its handle pid:<pid>:<start>) is in every
// one of the run's cgroups.
func agentIn(handle string, dirs []string) error {
	parts := strings.Split(handle, ":")
	if len(parts) != 3 {
		return errors.New("bad handle " + handle)
	}
	pid, _ := strconv.Atoi(parts[1])
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return err
		}
		if !strings.Contains("\n"+string(data), "\n"+strconv.Itoa(pid)+"\n") {
			return errors.New("the agent " + strconv.Itoa(pid) + " is not in its run's cgroup " + d)
		}
	}
	return nil
}

func TestWithoutAWritableCgroupRunsFailClosedUnlessRlimitsAreAccepted(t *testing.T) {
	// Not parallel: OnlyCgroupsUnder narrows the package's cgroup choice.
	requireRoot(t)
	testenv.Need(t, !hostrun.SystemdAvailable(), "this test needs a machine where systemd is not PID 1")
	tests := []struct {
		name     string
		under    string
		fallback bool
	}{
		{"No_cgroup_filesystem_fails_closed_and_names_the_switch", "/nonexistent", false},
		{"A_cgroup_v2_without_delegated_controllers_fails_closed", "/sys/fs/cgroup/unified", false},
		{"With_allow_rlimit_fallback_the_run_holds_to_rlimits", "/nonexistent", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hostrun.OnlyCgroupsUnder(t, tc.under)
			s := spec(t, "limits")
			s.Timeout = 90 * time.Second
			s.Limits = isolation.Limits{MemoryBytes: 300 << 20, Pids: 77, NanoCPUs: 500_000_000, RlimitFallback: tc.fallback}
			res, err := hostrun.Runner{}.Run(context.Background(), s)
			c := hostrun.Runner{}.Explain(s.Plan)
			holds, missing := strings.Join(c.Holds, "\n"), strings.Join(c.Missing, "\n")
			if !tc.fallback {
				if isolation.ReasonOf(err) != isolation.ReasonConfinement || !strings.Contains(err.Error(), "allow_rlimit_fallback") {
					t.Fatalf("run ended with %v, want %q naming allow_rlimit_fallback", err, isolation.ReasonConfinement)
				}
				if !strings.Contains(missing, "runs fail closed") || !strings.Contains(missing, "allow_rlimit_fallback = true") {
					t.Errorf("Explain does not say runs fail closed:\n%s", missing)
				}
				t.Logf("failed closed: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
			}
			for _, want := range []string{`Max data size\s+314572800\s+314572800\s+bytes`, `Max processes\s+77\s+77\s+processes`, `Max cpu time\s+90\s+90\s+seconds`} {
				if !regexp.MustCompile(want).MatchString(res.Response.Reply) {
					t.Errorf("agent's limits lack %q:\n%s", want, res.Response.Reply)
				}
			}
			if !strings.Contains(holds, "accepted by [scheduler] allow_rlimit_fallback = true") || !strings.Contains(holds, "RLIMIT_DATA=314572800") {
				t.Errorf("Explain does not say rlimits hold by the admin's choice:\n%s", holds)
			}
			if !strings.Contains(missing, "MemoryMax: RLIMIT_DATA limits each process") {
				t.Errorf("Explain does not say what rlimits miss:\n%s", missing)
			}
		})
	}
}

func readNumber(t *testing.T, name string) uint64 {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// readCount reads "key N" of a flat-keyed cgroup file.
func readCount(t *testing.T, name, key string) uint64 {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
