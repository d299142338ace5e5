package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// agentUIDAfter finds the number printed right after prefix in out and
// says whether it is a uid of the default agent_uids range, where every
// agent gets its own (docs/adr/0014-per-agent-uids.md).
func agentUIDAfter(out, prefix string) (uint32, bool) {
	m := regexp.MustCompile(regexp.QuoteMeta(prefix) + `(\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return 0, false
	}
	r := config.DefaultAgentUIDs
	return uint32(n), uint32(n) >= r.First && uint32(n) <= r.Last
}

// startUIDs starts a suite of agents (id → extra TOML of its [[agents]]
// table) bound to channels named like them, with [scheduler] extra lines.
func startUIDs(t *testing.T, agents []agentSpec, scheduler string) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[agents]]\nid = %q\nmax_iterations = 4\n%s\n\n", a.id, a.extra)
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = %q\n\n", agents[0].id)
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, sink.srv.URL+"/replies")
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = %q\nagent = %q\n\n", a.id, a.id)
	}
	// run_as stays nobody: it is what agent_uids = "off" uses.
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = 4\ndefault_timeout_seconds = 120\nrun_as = \"nobody\"\nallow_rlimit_fallback = true\nagent_binary = %q\n%s\n",
		filepath.Join(binDir, "berth-agent"), scheduler)
	return launch(t, sink, cfg.String(), nil, secret)
}

// ask1 posts msg in channel and returns the text of its reply, which must
// have succeeded.
func (s *suite) ask1(t *testing.T, channel, msg string, timeout time.Duration) string {
	t.Helper()
	id := s.mustPost(t, channel, msg)
	reply := s.sink.wait(t, timeout, id)[id]
	if reply["state"] != "succeeded" {
		t.Fatalf("%q in %s: state %v error %v reply %q", msg, channel, reply["state"], reply["error"], text(reply))
	}
	return text(reply)
}

// workspace is where agent's workspace is on the host, or a file in it.
func (s *suite) workspace(agent string, file ...string) string {
	return filepath.Join(append([]string{s.StateDir, "scheduler", "agents", agent}, file...)...)
}

func statOwner(t *testing.T, path string) uint32 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

func TestTwoAgentsRunAsUIDsOfTheirOwnThatHoldAcrossARestartAndKeepThemOutOfEachOthersWorkspace(t *testing.T) {
	t.Parallel()
	// beta is unrestricted: no Landlock at all, so only file permissions
	// can keep it out of alpha's workspace.
	s := startUIDs(t, []agentSpec{
		{id: "alpha"},
		{id: "beta", extra: "[agents.file_access]\nunrestricted = true"},
	}, "")
	out := s.ask1(t, "alpha", "/sh echo alpha-private > secret.txt; echo uid=$(id -u)", time.Minute)
	alpha, ok := agentUIDAfter(out, "uid=")
	if !ok {
		t.Fatalf("alpha's reply %q: want its own uid from agent_uids", out)
	}
	alphaSecret := s.workspace("alpha", "secret.txt")
	out = s.ask1(t, "beta", "/sh echo uid=$(id -u); cat "+alphaSecret, time.Minute)
	beta, ok := agentUIDAfter(out, "uid=")
	if !ok || beta == alpha {
		t.Fatalf("beta's reply %q: want a uid of its own from agent_uids, not alpha's %d", out, alpha)
	}
	if strings.Contains(out, "alpha-private") || !strings.Contains(out, "Permission denied") {
		t.Fatalf("beta's reply %q: want alpha's file refused by its permissions", out)
	}
	for agent, uid := range map[string]uint32{"alpha": alpha, "beta": beta} {
		if got := statOwner(t, s.workspace(agent)); got != uid {
			t.Errorf("%s's workspace is owned by uid %d, want its own %d", agent, got, uid)
		}
	}
	if got := statOwner(t, alphaSecret); got != alpha {
		t.Errorf("alpha's file is owned by uid %d, want %d", got, alpha)
	}
	// berthctl sandbox explain shows the uid runs get.
	if out, err := s.berthctl(t, "sandbox", "explain", "beta"); err != nil || !strings.Contains(out, fmt.Sprintf("uid %d", beta)) {
		t.Errorf("berthctl sandbox explain beta: err %v\n%s\nwant uid %d", err, out, beta)
	}

	// The next scheduler (activated again by the bus) reads the same uids
	// from scheduler.db; beta asks first this time.
	if err := s.KillService(bus.SchedulerName, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		agent string
		want  uint32
	}{{"beta", beta}, {"alpha", alpha}} {
		out := s.ask1(t, tc.agent, "/sh echo uid=$(id -u)", time.Minute)
		if got, _ := agentUIDAfter(out, "uid="); got != tc.want {
			t.Fatalf("after a restart %s runs as %d (%q), before as %d", tc.agent, got, out, tc.want)
		}
	}
}

// hog holds nearly all of a run's 256 processes (the default pids limit:
// RLIMIT_NPROC, or pids.max of the run's cgroup) until the test writes to
// the fifo: the berth-agent and its shell keep the few threads they need.
const hog = `/sh mkfifo release; i=0; while [ $i -lt 236 ]; do sleep 600 & i=$((i+1)); done; echo > holding; read x < release; echo released`

func TestAnAgentThatExhaustsItsProcessesLeavesTheOtherAgentAbleToRun(t *testing.T) {
	t.Parallel()
	s := startUIDs(t, []agentSpec{{id: "bomb"}, {id: "calm"}}, "")
	bombID := s.mustPost(t, "bomb", hog)
	ws := s.workspace("bomb")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(ws, "holding")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hog did not start its processes within 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	bombUID := statOwner(t, ws)

	// calm also holds itself to a per-user limit of 100 processes, well
	// below what the hog holds: its fork succeeds only if the hog's
	// processes are not counted as its own (they are, with a shared uid,
	// whether the runs have cgroups or rlimits).
	out := s.ask1(t, "calm", `/sh echo calm ran as $(id -u); prlimit --nproc=100 sh -c 'x=$(echo hi); echo forked $x'`, time.Minute)
	if !strings.Contains(out, "forked hi") {
		t.Fatalf("calm's reply %q: want its fork to succeed beside the hog", out)
	}
	if _, ok := agentUIDAfter(out, "calm ran as "); !ok {
		t.Fatalf("calm's reply %q: want it run as its own uid", out)
	}
	// The hog was still holding its processes while calm ran.
	if n := tasksOf(t, bombUID); n < 200 {
		t.Fatalf("uid %d has %d tasks after calm's run, want the hog's 236 still there", bombUID, n)
	}
	f, err := os.OpenFile(filepath.Join(ws, "release"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "go")
	f.Close()
	reply := s.sink.wait(t, time.Minute, bombID)[bombID]
	if !strings.Contains(text(reply), "released") {
		t.Fatalf("the hog's reply %q (state %v error %v): want it to have run to its end", text(reply), reply["state"], reply["error"])
	}
}

// tasksOf counts the tasks (threads included, as RLIMIT_NPROC does) whose
// real uid is uid.
func tasksOf(t *testing.T, uid uint32) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/task/[0-9]*/status")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	want := strconv.FormatUint(uint64(uid), 10)
	for _, p := range procs {
		f, err := os.Open(p)
		if err != nil {
			continue // gone meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 1 && fields[0] == "Uid:" {
				if fields[1] == want {
					n++
				}
				break
			}
		}
		f.Close()
	}
	return n
}

func TestAContainerAgentRunsAsItsOwnUIDAndWritesItsWorkspace(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	s := startUIDs(t, []agentSpec{{id: "boxed-uid", extra: containerAgent}}, "")
	out := s.ask1(t, "boxed-uid", "/sh echo uid=$(id -u) home=$HOME; echo made-inside > /workspace/note && echo wrote", 3*time.Minute)
	uid, ok := agentUIDAfter(out, "uid=")
	if !ok || !strings.Contains(out, "home=/workspace") || !strings.Contains(out, "wrote") {
		t.Fatalf("reply %q: want the container as the agent's own uid, HOME /workspace, and a written file", out)
	}
	note := s.workspace("boxed-uid", "note")
	if got := statOwner(t, note); got != uid {
		t.Fatalf("%s is owned by uid %d on the host, want the agent's %d", note, got, uid)
	}
}

func TestAgentUIDsOffRunsEveryAgentAsRunAs(t *testing.T) {
	t.Parallel()
	s := startUIDs(t, []agentSpec{{id: "one"}, {id: "two"}}, `agent_uids = "off"`)
	for _, agent := range []string{"one", "two"} {
		if out := s.ask1(t, agent, "/sh echo uid=$(id -u)", time.Minute); !strings.Contains(out, "uid=65534") {
			t.Fatalf("%s's reply %q: want run_as nobody (65534)", agent, out)
		}
	}
}
