package runprep

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
	"github.com/berth-dev/berth/services/egress"
)

// goBuild builds a static binary of the module into dir.
func goBuild(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./"+pkg)
	cmd.Dir = filepath.Join(testkube.RepoRoot())
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// A tool in a pod reaches the outside only through berth's router and the
// run's own berth-egress: a refused host gets the proxy's 403 with its
// reason (recorded as the run's decision), and a direct connection fails.
func TestKubernetesToolsGoOutOnlyThroughTheRunsProxy(t *testing.T) {
	testenv.NeedRoot(t)
	cfg := testkube.Config(t)
	cs := testkube.Clientset(t)
	ns := testkube.Namespace(t, cs)
	// berth-egress runs as nobody: its binary and directories are not 0700.
	dir, err := os.MkdirTemp("", "berth-kube-egress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	agentBin := goBuild(t, dir, "cmd/berth-agent")
	egressBin := goBuild(t, dir, "cmd/berth-egress")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := imagectl.Ensure(ctx, testdocker.Engine(t), imagectl.AgentImage{AgentBinary: agentBin})
	if err != nil {
		t.Fatal(err)
	}
	testkube.LoadImage(t, tag)

	ln := testkube.ListenForPods(t)
	addr := ln.Addr().String()
	ln.Close()
	p := &Preparer{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r, err := p.kubeRouterFor(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ln.Close() })

	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	token, _ := egress.NewToken()
	rule, _ := isolation.ParseEgressRule("allowed.example")
	socket := filepath.Join(dir, "egress", "run-k1", isolation.EgressSocketName)
	proxy, err := egress.Launch(ctx, egress.Policy{RunID: "run-k1", Agent: "tester", Token: token, Allow: []isolation.EgressRule{rule}},
		egress.LaunchOptions{Binary: egressBin, User: nobody, Client: nobody, Socket: socket, Logger: p.log})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Stop()
	defer r.add(socket, token)()

	b, err := kube.New(kube.Options{Config: cfg, Instance: t.Name(), Namespace: ns, ProxyHost: testkube.BridgeIP})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Drain(context.Background())
	policy := isolation.ContainerPolicy(false)
	_, port, _ := strings.Cut(addr, ":")
	var routerPort uint16
	for _, c := range port {
		routerPort = routerPort*10 + uint16(c-'0')
	}
	policy.ConnectPorts = append(policy.ConnectPorts, isolation.EgressProxyPort, routerPort)
	// A listener the pod's network reaches (a host port pods may use), so
	// only the sandbox's own confinement keeps the tool from it.
	open := testkube.ListenForPods(t)
	go func() {
		for {
			c, err := open.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "reached-directly\n")
			c.Close()
		}
	}()
	// The tool keeps its side open until the answer came (busybox nc ends
	// the request when its stdin ends).
	script := `/sh (printf 'GET http://refused.example/ HTTP/1.0\r\nHost: refused.example\r\n\r\n'; sleep 3) | nc -w 5 127.0.0.1 3128; echo; echo direct=$(nc -w 3 ` + strings.Replace(open.Addr().String(), ":", " ", 1) + ` </dev/null 2>&1 | head -c 200)`
	s := isolation.Spec{
		Plan: isolation.Plan{
			Backend: isolation.BackendKubernetes, RunID: "run-k1", Attempt: 1, AgentID: "tester",
			Workspace: "/nonexistent", SandboxWorkspace: isolation.ContainerWorkspace,
			User: &isolation.RunUser{Name: "agent", UID: 1879048201, GID: 1879048201}, RunAs: "agent",
			Timeout: 2 * time.Minute, KillGrace: 2 * time.Second, Policy: policy,
			Limits:  isolation.Limits{MemoryBytes: 256 << 20, Pids: 256, NanoCPUs: 500_000_000, TmpfsBytes: 64 << 20},
			Network: isolation.Network{Mode: "none"},
			Kube:    isolation.KubePlan{Namespace: ns, Image: tag, ImagePullPolicy: "Never", ProxyAddr: addr, EgressVerifiedBy: "probe"},
			Egress: &isolation.EgressPlan{Socket: socket, SandboxSocket: isolation.KubeEgressSocketPrefix + addr,
				ProxyAddr: "127.0.0.1:3128", Allow: []isolation.EgressRule{rule}},
		},
		EgressToken: token,
		Request: agentproto.Request{Version: agentproto.Version, RunID: "run-k1",
			Agent:    agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message:  agentproto.Message{ID: "m1", Author: "t", Text: script},
			Provider: agentproto.Provider{Name: "local", Kind: "local"}},
	}
	res, err := b.Run(ctx, s)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Stderr)
	}
	reply := res.Response.Reply
	if !strings.Contains(reply, "403") || !strings.Contains(reply, "refused.example") {
		t.Errorf("the tool's request to a refused host: %q, want the proxy's 403 with its reason", reply)
	}
	if i := strings.Index(reply, "direct="); i < 0 || !strings.Contains(reply[i:], "can't connect") || strings.Contains(reply, "reached-directly\n") {
		t.Errorf("a direct connection from the pod: %q, want it refused", reply)
	}
	rec := proxy.Stop()
	found := false
	for _, d := range rec.Decisions {
		found = found || strings.Contains(d.Host, "refused.example") && !d.Allowed
	}
	if !found {
		t.Errorf("the run's record lacks the refusal: %+v", rec.Decisions)
	}
}
