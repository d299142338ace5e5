package hostrun_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// egressRun is a confined run of the real berth-agent as agent's own uid
// with an egress socket at socket, running command through the shell tool.
func egressRun(t *testing.T, agent string, uid uint32, socket, command string) isolation.Spec {
	t.Helper()
	ws, err := os.MkdirTemp(base, "ws-"+agent+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
	runID := "run-" + agent + "-" + strings.ReplaceAll(t.Name(), "/", "-")
	return isolation.Spec{
		Plan: isolation.Plan{RunID: runID, AgentID: agent, Workspace: ws, AgentBinary: berthAgent, User: runplan.AgentUserFor(uid), Timeout: time.Minute,
			Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9},
			Policy: isolation.HostPolicy(isolation.FileAccess{AllowRead: []string{sysprobe(t)}}, ws, nil),
			Egress: &isolation.EgressPlan{Socket: socket, SandboxSocket: socket, ProxyAddr: "127.0.0.1:3128"}},
		EgressToken: "tok-" + agent + "-0123456789abcdef",
		Request: agentproto.Request{Version: agentproto.Version, RunID: runID, Workspace: ws,
			Agent:    agentproto.Agent{ID: agent, MaxIterations: 2},
			Message:  agentproto.Message{ID: "m1", Text: "/sh " + command},
			Provider: agentproto.Provider{Name: "local", Kind: "local"}},
	}
}

// waitForFile waits until path exists (a run's tool made it) or the run
// reports its end on ended.
func waitForFile(t *testing.T, path string, ended <-chan error) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-ended:
			t.Fatalf("the run ended before it made %s: %v", path, err)
		case <-deadline:
			t.Fatalf("%s did not appear within a minute", path)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// egressSockets lays out <root>/<run>/egress.sock for each run, as
// <state>/egress is, each listening and world-writable. root is under
// /var/lib, outside /tmp and /run: their masks would hide it whole.
func egressSockets(t *testing.T, runs ...string) (root string, sockets map[string]string) {
	t.Helper()
	root, err := os.MkdirTemp("/var/lib", "berth-test-egress-")
	testenv.Need(t, err == nil, "cannot make a directory under /var/lib: %v", err)
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sockets = map[string]string{}
	for _, run := range runs {
		dir := filepath.Join(root, run)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sockets[run] = filepath.Join(dir, isolation.EgressSocketName)
		listenWorldWritable(t, sockets[run])
	}
	return root, sockets
}

// Every run's egress socket lies in a directory of its own beside the
// others' (<state>/egress/<run>/egress.sock), and Landlock does not govern
// connect(): a tool of one run could talk to another run's proxy while both
// run, wherever DAC lets it (a non-root scheduler leaves the socket 0666;
// agents sharing a run_as user share its uid). A run sees only its own
// egress directory there; an unrestricted run (the control) reaches the
// other's socket.
func TestARunCannotReachAnotherRunsEgressSocket(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	root, sockets := egressSockets(t, "first", "second")
	probe := sysprobe(t)

	first := egressRun(t, "first", 1879048192+2718, sockets["first"], "touch started; while [ ! -e release ]; do sleep 0.05; done; echo released")
	ended := make(chan error, 1)
	go func() {
		res, err := hostrun.Runner{}.Run(context.Background(), first)
		if err == nil && !strings.Contains(res.Response.Reply, "released") {
			err = errors.New("reply: " + res.Response.Reply)
		}
		ended <- err
	}()
	release := func() {
		os.WriteFile(filepath.Join(first.Workspace, "release"), nil, 0o644)
	}
	t.Cleanup(release)
	waitForFile(t, filepath.Join(first.Workspace, "started"), ended)

	command := probe + " connect " + sockets["first"] + "; " + probe + " connect " + sockets["second"] + "; echo listing: $(ls " + root + ")"
	second := egressRun(t, "second", 1879048192+2719, sockets["second"], command)
	res, err := hostrun.Runner{}.Run(context.Background(), second)
	if err != nil {
		t.Fatalf("the second run failed: %v\nstderr: %s", err, res.Stderr)
	}
	reply := res.Response.Reply
	if got := lineOf(reply, "connect "+sockets["first"]); !strings.HasSuffix(got, "connect: no such file or directory") {
		t.Errorf("the second run reaches the first run's socket: %q\nreply:\n%s", got, reply)
	}
	if got := lineOf(reply, "connect "+sockets["second"]); !strings.HasSuffix(got, " ok") {
		t.Errorf("the second run's own socket: %q, want ok\nreply:\n%s", got, reply)
	}
	if got := lineOf(reply, "listing:"); strings.Contains(got, "first") {
		t.Errorf("the second run lists the first run's egress directory: %q", got)
	}

	control := egressRun(t, "control", 1879048192+2720, sockets["second"], probe+" connect "+sockets["first"])
	control.Policy = isolation.HostPolicy(isolation.FileAccess{Unrestricted: true}, control.Workspace, nil)
	res, err = hostrun.Runner{AllowRoot: true}.Run(context.Background(), control)
	if err != nil {
		t.Fatalf("the control run failed: %v\nstderr: %s", err, res.Stderr)
	}
	if got := lineOf(res.Response.Reply, "connect "+sockets["first"]); !strings.HasSuffix(got, " ok") {
		t.Errorf("unrestricted run (the control): %q, want it to get through\nreply:\n%s", got, res.Response.Reply)
	}

	release()
	if err := <-ended; err != nil {
		t.Errorf("the first run: %v", err)
	}
}

// A non-root scheduler leaves every run's socket 0666: berth-agent, masking
// itself, shows its run only its own egress directory too.
func TestARunOfANonRootSchedulerCannotReachAnotherRunsEgressSocket(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	_, sockets := egressSockets(t, "other", "own")
	probe := sysprobe(t)
	out := runAsNobody(t, "",
		"HELPER_AGENT="+berthAgent,
		"HELPER_ALLOW_READ="+probe,
		"HELPER_EGRESS_SOCKET="+sockets["own"],
		"HELPER_TEXT=/sh "+probe+" connect "+sockets["other"]+"; "+probe+" connect "+sockets["own"])
	if out.Reason != "" {
		if out.Reason != isolation.ReasonConfinement {
			t.Fatalf("got %q (%s), want a run or a confinement failure", out.Reason, out.Error)
		}
		t.Logf("the kernel refused the namespaces; the run failed closed: %s", out.Error)
		return
	}
	if got := lineOf(out.Reply, "connect "+sockets["other"]); !strings.HasSuffix(got, "connect: no such file or directory") {
		t.Errorf("the run reaches another run's socket: %q\nreply:\n%s", got, out.Reply)
	}
	if got := lineOf(out.Reply, "connect "+sockets["own"]); !strings.HasSuffix(got, " ok") {
		t.Errorf("the run's own socket: %q, want ok\nreply:\n%s", got, out.Reply)
	}
}
