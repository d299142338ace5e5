package container_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

var (
	agentBinary string
	buildErr    error
	// binDir holds the binaries the tests build; TestMain removes it.
	binDir string
)

func TestMain(m *testing.M) {
	if os.Getenv(keepHelperEnv) != "" {
		os.Exit(runKeepHelper())
	}
	code := func() int {
		dir, err := os.MkdirTemp("", "berth-container-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		agentBinary = filepath.Join(dir, "berth-agent")
		if prebuilt := os.Getenv("BERTH_TEST_AGENT_BINARY"); prebuilt != "" {
			// A static berth-agent built elsewhere (e.g. while agent/ is being edited).
			agentBinary = prebuilt
			return m.Run()
		}
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentBinary, "./cmd/berth-agent")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("cannot build berth-agent: %v\n%s", err, out)
		}
		return m.Run()
	}()
	os.Exit(code)
}

// engine returns a client of the local engine, failing under CI=true and
// skipping elsewhere when none answers.
func engine(t *testing.T) *client.Client {
	t.Helper()
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	cli := testdocker.Engine(t)
	_, err := os.Stat("/bin/busybox")
	testenv.Need(t, err == nil, "busybox-static is not installed")
	return cli
}

// newBackend is a backend of its own instance, so sweeps of parallel tests
// never meet.
// runToken tells this test binary's containers from those an earlier,
// interrupted run may have left behind on the same engine.
var runToken = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())

// instance is the berth.instance of a test's backend: one per test and run.
func instance(t *testing.T) string { return t.Name() + "@" + runToken }

func newBackend(t *testing.T, cli *client.Client) *container.Backend {
	t.Helper()
	b, err := container.New(container.Options{Client: cli, Instance: instance(t)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// workspace is a directory the agent user (nobody) owns.
func workspace(t *testing.T) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return ws
}

var runSeq struct {
	sync.Mutex
	n int
}

// box is what a test sets of an agent's container_mode; spec turns it into
// the plan internal/runplan would compile.
type box struct {
	Image       string
	MemoryLimit string // like memory_limit: 128m
	Network     string
	Runtime     string
	Warm        int
	Binds       []string
	SecurityOpt []string
}

func spec(t *testing.T, ws, text string, c box) isolation.Spec {
	runSeq.Lock()
	runSeq.n++
	id := fmt.Sprintf("test%d_%d", time.Now().UnixNano(), runSeq.n)
	runSeq.Unlock()
	if c.Network == "" {
		c.Network = "none"
	}
	memory := int64(512 << 20)
	if c.MemoryLimit != "" {
		mb, err := strconv.ParseInt(strings.TrimSuffix(c.MemoryLimit, "m"), 10, 64)
		if err != nil {
			t.Fatalf("memory limit %q: write it in m", c.MemoryLimit)
		}
		memory = mb << 20
	}
	mounts := []isolation.Mount{{Source: ws, Target: isolation.ContainerWorkspace}}
	for _, b := range c.Binds {
		parts := strings.Split(b, ":")
		m := isolation.Mount{Source: parts[0], Target: parts[1]}
		m.ReadOnly = len(parts) == 3 && parts[2] == "ro"
		mounts = append(mounts, m)
	}
	return isolation.Spec{
		Plan: isolation.Plan{
			Backend:          isolation.BackendContainer,
			RunID:            id,
			AgentID:          "tester",
			Workspace:        ws,
			SandboxWorkspace: isolation.ContainerWorkspace,
			AgentBinary:      agentBinary,
			RunAs:            "nobody",
			Timeout:          60 * time.Second,
			Policy:           isolation.ContainerPolicy(c.Network != "none"),
			Limits:           isolation.Limits{MemoryBytes: memory, Pids: 256, NanoCPUs: 1e9, TmpfsBytes: 256 << 20},
			Network:          isolation.Network{Allowed: c.Network != "none", Mode: c.Network},
			Mounts:           mounts,
			Container:        isolation.ContainerPlan{Image: c.Image, Runtime: c.Runtime, Warm: c.Warm, SecurityOpt: c.SecurityOpt},
		},
		Request: agentproto.Request{
			Version:  agentproto.Version,
			RunID:    id,
			Agent:    agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message:  agentproto.Message{ID: id, Author: "t", Text: text},
			Provider: agentproto.Provider{Name: "local", Kind: "local"},
		},
	}
}

func run(t *testing.T, b *container.Backend, s isolation.Spec) (isolation.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return b.Run(ctx, s)
}

func mustRun(t *testing.T, b *container.Backend, s isolation.Spec) string {
	t.Helper()
	res, err := run(t, b, s)
	if err != nil {
		t.Fatalf("run %q: %v\nstderr: %s", s.Request.Message.Text, err, res.Stderr)
	}
	return res.Response.Reply
}

// containersOf lists every container (running or not) labelled with run.
func containersOf(t *testing.T, cli *client.Client, run string) int {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", container.LabelRun+"="+run)})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

func TestRequestRoundTripsThroughAFreshContainerThatIsRemovedAfterwards(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	s := spec(t, workspace(t), "/sh echo hello from $(pwd) as $(id -u) home=$HOME", box{})
	var handle string
	s.OnStart = func(h string) error { handle = h; return nil }
	reply := mustRun(t, b, s)
	if !strings.Contains(reply, "hello from /workspace as 65534 home=/workspace") {
		t.Fatalf("reply %q: want the agent in /workspace as nobody", reply)
	}
	if !strings.HasPrefix(handle, "container:") {
		t.Fatalf("OnStart handle %q, want container:<id>", handle)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("%d containers of run %s left behind", n, s.RunID)
	}
}

func TestWorkspacePersistsAcrossRunsWhileTmpDoesNot(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	ws := workspace(t)
	mustRun(t, b, spec(t, ws, "/sh echo kept > /workspace/note && echo gone > /tmp/scratch && cat /tmp/scratch", box{}))
	reply := mustRun(t, b, spec(t, ws, "/sh cat /workspace/note; cat /tmp/scratch", box{}))
	if !strings.Contains(reply, "kept") || strings.Contains(reply, "gone") || !strings.Contains(reply, "No such file") {
		t.Fatalf("second run: %q; want the workspace file and no /tmp file", reply)
	}
	if data, err := os.ReadFile(filepath.Join(ws, "note")); err != nil || string(data) != "kept\n" {
		t.Fatalf("workspace on the host: %q, %v", data, err)
	}
}

func TestContainerIsHardenedAndTheSecretIsNeverVisibleInDockerInspect(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	const secret = "sk-berth-test-SECRET-4711"
	s := spec(t, workspace(t), "/sh sleep 3; echo done", box{MemoryLimit: "128m"})
	s.Request.Provider.Key = secret
	inspected := make(chan string, 1)
	s.OnStart = func(h string) error {
		go func() {
			time.Sleep(time.Second)
			out, err := exec.Command("docker", "inspect", strings.TrimPrefix(h, "container:")).CombinedOutput()
			if err != nil {
				inspected <- "docker inspect failed: " + err.Error() + string(out)
				return
			}
			inspected <- string(out)
		}()
		return nil
	}
	if reply := mustRun(t, b, s); !strings.Contains(reply, "done") {
		t.Fatalf("reply %q", reply)
	}
	out := <-inspected
	if strings.Contains(out, secret) || strings.Contains(out, "sk-berth-test") {
		t.Fatalf("the provider key is visible in docker inspect:\n%s", out)
	}
	var got []struct {
		Config struct {
			User       string
			Env        []string
			Cmd        []string
			Labels     map[string]string
			WorkingDir string
		}
		HostConfig struct {
			ReadonlyRootfs bool
			CapDrop        []string
			SecurityOpt    []string
			Memory         int64
			MemorySwap     int64
			PidsLimit      int64
			NanoCpus       int64
			NetworkMode    string
			Binds          []string
			Tmpfs          map[string]string
			PortBindings   map[string]any
			Privileged     bool
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("cannot decode docker inspect (%v):\n%s", err, out)
	}
	c, h := got[0].Config, got[0].HostConfig
	checks := []struct {
		what string
		ok   bool
	}{
		{"read-only rootfs", h.ReadonlyRootfs},
		{"CapDrop ALL", len(h.CapDrop) == 1 && strings.EqualFold(h.CapDrop[0], "ALL")},
		{"no-new-privileges", strings.Join(h.SecurityOpt, ",") == "no-new-privileges"},
		{"memory 128m, no extra swap", h.Memory == 128<<20 && h.MemorySwap == 128<<20},
		{"pids limit 256", h.PidsLimit == 256},
		{"one CPU", h.NanoCpus == 1e9},
		{"network none", h.NetworkMode == "none"},
		{"only the workspace bind", len(h.Binds) == 1 && strings.HasSuffix(h.Binds[0], ":/workspace:rw")},
		{"/tmp tmpfs of 256m", strings.Contains(h.Tmpfs["/tmp"], "size=256m")},
		{"no published ports", len(h.PortBindings) == 0},
		{"not privileged", !h.Privileged},
		{"non-root user", c.User == "65534:65534"},
		{"workdir /workspace", c.WorkingDir == "/workspace"},
		{"labels", c.Labels[container.LabelRun] == s.RunID && c.Labels[container.LabelAgent] == "tester" && c.Labels[container.LabelConfigHash] != ""},
		{"no command line", len(c.Cmd) == 0},
		{"minimal environment", strings.Join(c.Env, " ") == strings.Join(container.Environment(), " ")},
	}
	for _, ck := range checks {
		if !ck.ok {
			t.Errorf("%s: not so in docker inspect: config %+v host %+v", ck.what, c, h)
		}
	}
}

func TestAgentHasNoCapabilitiesAndCannotWriteTheImage(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	reply := mustRun(t, b, spec(t, workspace(t), "/sh touch /workspace/f && chown 0:0 /workspace/f; echo chown=$?; touch /bin/evil; echo touch=$?; grep Cap /proc/$$/status", box{}))
	if !strings.Contains(reply, "chown=1") || !strings.Contains(reply, "Operation not permitted") {
		t.Fatalf("chown in the container: %q; want Operation not permitted", reply)
	}
	if !strings.Contains(reply, "touch=1") {
		t.Fatalf("writing /bin: %q; want a failure", reply)
	}
}

// gatewayIP is the host's address on docker0: reachable from a bridge
// container, and never an external address.
func gatewayIP(t *testing.T) string {
	t.Helper()
	iface, err := net.InterfaceByName("docker0")
	if err != nil {
		t.Fatalf("no docker0 bridge: %v", err)
	}
	addrs, _ := iface.Addrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	t.Fatal("docker0 has no IPv4 address")
	return ""
}

func TestNetworkNoneBlocksEgressThatBridgeAllows(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	l, err := net.Listen("tcp", gatewayIP(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached-the-host") })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	host, port, _ := net.SplitHostPort(l.Addr().String())
	cmd := `/sh printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 ` + host + " " + port + "; echo nc=$?"

	for _, tc := range []struct {
		network string
		reached bool
	}{{"none", false}, {"bridge", true}} {
		reply := mustRun(t, b, spec(t, workspace(t), cmd, box{Network: tc.network}))
		if got := strings.Contains(reply, "reached-the-host"); got != tc.reached {
			t.Errorf("network %s: reached the host = %v, want %v; reply %q", tc.network, got, tc.reached, reply)
		}
	}
}

func TestMemoryBombFailsTheRunWithOutOfMemory(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	s := spec(t, workspace(t), `/sh set -o pipefail; head -c 400000000 /dev/zero | tr '\0' x | sort | wc -c`, box{MemoryLimit: "64m"})
	res, err := run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonOutOfMemory {
		t.Fatalf("memory bomb: %v; want reason %q\nexit %d, tool calls %+v\nstderr: %s", err, isolation.ReasonOutOfMemory, res.ExitCode, res.Response.ToolCalls, res.Stderr)
	}
}

func TestForkBombIsStoppedByThePidsLimit(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	s := spec(t, workspace(t), `/sh i=0; while [ $i -lt 400 ]; do sleep 60 >/dev/null 2>&1 & i=$((i+1)); done; echo started-all`, box{})
	start := time.Now()
	res, err := run(t, b, s)
	if err != nil {
		t.Fatalf("fork bomb run: %v (stderr %s)", err, res.Stderr)
	}
	reply := res.Response.Reply
	if !strings.Contains(reply, "can't fork") {
		t.Fatalf("reply %q: want the shell refused forks beyond the pids limit", reply)
	}
	if d := time.Since(start); d > 50*time.Second {
		t.Fatalf("fork bomb run took %v", d)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("%d containers left behind", n)
	}
}

func TestRunPastItsTimeoutIsKilledAndRemoved(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	s := spec(t, workspace(t), "/sh sleep 120", box{})
	s.Timeout = 3 * time.Second
	start := time.Now()
	_, err := run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonTimeout {
		t.Fatalf("run: %v; want reason timeout", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("timeout took %v to take effect", d)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("%d containers of the timed-out run left behind", n)
	}
}

func TestSweepRemovesOrphansOfItsOwnInstanceOnly(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	first := newBackend(t, cli)
	s := spec(t, workspace(t), "/sh sleep 120", box{})
	started := make(chan struct{})
	s.OnStart = func(string) error { close(started); return nil }
	done := make(chan error, 1)
	go func() { _, err := run(t, first, s); done <- err }()
	<-started

	other, err := container.New(container.Options{Client: cli, Instance: instance(t) + "-other"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if removed, err := other.Sweep(ctx, nil); err != nil || len(removed) != 0 {
		t.Fatalf("another instance's sweep removed %v (%v); want nothing", removed, err)
	}
	restarted := newBackend(t, cli) // same instance: a restarted scheduler
	if removed, err := restarted.Sweep(ctx, func(run string, _ int) bool { return run != s.RunID }); err != nil || len(removed) != 1 || removed[0] != s.RunID {
		t.Fatalf("sweep removed %v (%v); want run %s", removed, err, s.RunID)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the run whose container was swept succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not end after its container was removed")
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("%d containers left behind", n)
	}
}

func TestDangerousSettingsNeverReachTheEngine(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	for _, tc := range []struct {
		name string
		c    box
		want string
	}{
		{"Docker_socket_bind", box{Binds: []string{"/var/run/docker.sock:/var/run/docker.sock"}}, "Docker socket"},
		{"Etc_bind", box{Binds: []string{"/etc:/etc2:ro"}}, "under /etc"},
		{"Host_network", box{Network: "host"}, "host's network"},
		{"Unconfined_seccomp", box{SecurityOpt: []string{"seccomp=unconfined"}}, "seccomp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(t, workspace(t), "/sh echo should-not-run", tc.c)
			_, err := run(t, b, s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run: %v; want a refusal mentioning %q", err, tc.want)
			}
			if n := containersOf(t, cli, s.RunID); n != 0 {
				t.Fatalf("a container was created for a refused config")
			}
		})
	}
}

func TestUnknownRuntimeIsRefusedWithTheEnginesRuntimes(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	_, err := run(t, b, spec(t, workspace(t), "/sh true", box{Runtime: "no-such-runtime"}))
	if err == nil || !strings.Contains(err.Error(), `"no-such-runtime" is not registered`) || !strings.Contains(err.Error(), "runc") {
		t.Fatalf("run: %v; want a refusal listing runc", err)
	}
}

func TestMissingImageAndUnreachableEngineSayWhatToDo(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	_, err := run(t, b, spec(t, workspace(t), "/sh true", box{Image: "berth-test-missing:nope"}))
	if isolation.ReasonOf(err) != isolation.ReasonImageUnavailable || !strings.Contains(err.Error(), "docker build/load") {
		t.Fatalf("missing image: %v", err)
	}

	down, err := client.New(client.WithHost("unix://" + filepath.Join(t.TempDir(), "no-docker.sock")))
	if err != nil {
		t.Fatal(err)
	}
	nb, err := container.New(container.Options{Client: down, Instance: instance(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = run(t, nb, spec(t, workspace(t), "/sh true", box{}))
	if isolation.ReasonOf(err) != isolation.ReasonEngineUnavailable || !strings.Contains(err.Error(), "systemctl start docker") {
		t.Fatalf("engine down: %v", err)
	}
}

func TestImageOfAnotherArchitectureIsRefusedBeforeStartNamingBoth(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	arch := "arm64"
	if runtime.GOARCH == "arm64" {
		arch = "amd64"
	}
	image := testdocker.ForeignImage(t, cli, arch)
	s := spec(t, workspace(t), "/sh true", box{Image: image})
	_, err := run(t, b, s)
	if err == nil || !strings.Contains(err.Error(), "built for "+arch) || !strings.Contains(err.Error(), "exec format error") {
		t.Fatalf("run: %v; want a refusal naming %s and the engine's architecture", err, arch)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("a container was created for a foreign image")
	}
}

func TestAgentCannotOpenARawSocket(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	// arping needs a packet socket and traceroute a raw ICMP socket: both
	// need CAP_NET_RAW, which no container agent has (even on the bridge).
	reply := mustRun(t, b, spec(t, workspace(t), "/sh arping -c 1 -w 1 -I eth0 127.0.0.1; echo arping=$?; traceroute -n -m 1 -w 1 127.0.0.1; echo traceroute=$?", box{Network: "bridge"}))
	for _, tool := range []string{"arping", "traceroute"} {
		if !strings.Contains(reply, tool+"=1") {
			t.Errorf("%s in the container: %q; want it to fail", tool, reply)
		}
	}
	if strings.Count(reply, "Operation not permitted") < 2 {
		t.Fatalf("reply %q: want both raw sockets refused with Operation not permitted", reply)
	}
}
