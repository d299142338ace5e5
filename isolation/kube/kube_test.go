package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// A pod-shaped secret: what a provider key looks like to a test that
// searches the pod for it.
const secret = "sk-berth-kube-SECRET-0815"

var agentImage struct {
	once sync.Once
	tag  string
	err  error
}

// image is the berth-agent image (imagectl's, FROM scratch with busybox),
// built in Docker from a fresh static berth-agent and loaded into the test
// cluster.
func image(t *testing.T) string {
	t.Helper()
	testkube.Config(t)
	cli := testdocker.Engine(t)
	agentImage.once.Do(func() {
		dir, err := os.MkdirTemp("", "berth-kube-test-")
		if err != nil {
			agentImage.err = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "berth-agent")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/berth-agent")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentImage.err = fmt.Errorf("cannot build berth-agent: %v\n%s", err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		agentImage.tag, agentImage.err = imagectl.Ensure(ctx, cli, imagectl.AgentImage{AgentBinary: bin})
	})
	if agentImage.err != nil {
		t.Fatal(agentImage.err)
	}
	testkube.LoadImage(t, agentImage.tag)
	return agentImage.tag
}

// cluster is a backend on the test cluster in a fresh namespace, whose pods
// may reach berth's router address (ListenForPods' port) only.
type cluster struct {
	cs    kubernetes.Interface
	ns    string
	proxy string // the router's address pods reach
	b     *kube.Backend
}

func newCluster(t *testing.T) cluster {
	t.Helper()
	cs := testkube.Clientset(t)
	ns := testkube.Namespace(t, cs)
	ln := testkube.ListenForPods(t)
	proxy := ln.Addr().String()
	ln.Close() // the probe (or the router) listens there
	b := newBackend(t, ns, t.Name())
	return cluster{cs: cs, ns: ns, proxy: proxy, b: b}
}

func newBackend(t *testing.T, ns, instance string) *kube.Backend {
	t.Helper()
	b, err := kube.New(kube.Options{Config: testkube.Config(t), Instance: instance, Namespace: ns, ProxyHost: testkube.BridgeIP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = b.Drain(ctx)
	})
	return b
}

var seq struct {
	sync.Mutex
	n int
}

// spec is a run of the local provider (its /sh command runs text) as
// internal/runplan compiles a kubernetes plan.
func (c cluster) spec(t *testing.T, img, text string) isolation.Spec {
	seq.Lock()
	seq.n++
	id := fmt.Sprintf("kt%d_%d", time.Now().UnixNano(), seq.n)
	seq.Unlock()
	policy := isolation.ContainerPolicy(false)
	return isolation.Spec{
		Plan: isolation.Plan{
			Backend: isolation.BackendKubernetes, RunID: id, Attempt: 1, AgentID: "tester",
			Workspace: "/nonexistent", SandboxWorkspace: isolation.ContainerWorkspace,
			RunAs: "nobody", User: &isolation.RunUser{Name: "agent", UID: 1879048200, GID: 1879048200},
			Timeout: 2 * time.Minute, KillGrace: 2 * time.Second, Policy: policy,
			Limits:  isolation.Limits{MemoryBytes: 256 << 20, Pids: 256, NanoCPUs: 500_000_000, TmpfsBytes: 64 << 20},
			Network: isolation.Network{Mode: "none"},
			Kube:    isolation.KubePlan{Namespace: c.ns, Image: img, ImagePullPolicy: "Never", ProxyAddr: c.proxy, EgressVerifiedBy: "probe"},
		},
		Request: agentproto.Request{
			Version: agentproto.Version, RunID: id,
			Agent:    agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message:  agentproto.Message{ID: id, Author: "t", Text: text},
			Provider: agentproto.Provider{Name: "local", Kind: "local", Key: secret},
		},
	}
}

func run(t *testing.T, b *kube.Backend, s isolation.Spec) (isolation.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	return b.Run(ctx, s)
}

func podsOf(t *testing.T, cs kubernetes.Interface, ns, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// waitGone waits until no pod matches selector (the deletions run in the
// background once a run is answered).
func waitGone(t *testing.T, cs kubernetes.Interface, ns, selector string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for len(podsOf(t, cs, ns, selector)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("pods %s are still there: %+v", selector, podsOf(t, cs, ns, selector))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A run's reply comes from a pod that ran berth-agent as the plan's uid,
// non-root, on a read-only root with no capabilities, and the key is in
// neither the pod's spec nor its environment nor its files.
func TestKubernetesRunRepliesFromAHardenedPodWithoutTheKey(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	s := c.spec(t, img, "/sh echo uid=$(id -u) gid=$(id -g); touch /bin/evil; echo touch=$?; echo kept > /workspace/f && cat /workspace/f; chown 0:0 /workspace/f; echo chown=$?; echo files=$(grep -rl sk-berth-kube / 2>/dev/null | grep -v -e ^/proc -e ^/sys | wc -l) env=$(env | grep -c sk-berth-kube)")
	var handle string
	podJSON := make(chan []byte, 1)
	s.OnStart = func(h string) error {
		handle = h
		name := h[strings.LastIndexByte(h, '/')+1:]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pod, err := c.cs.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		data, _ := json.Marshal(pod)
		podJSON <- data
		return nil
	}
	res, err := run(t, c.b, s)
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, res.Stderr)
	}
	reply := res.Response.Reply
	for _, want := range []string{"uid=1879048200 gid=1879048200", "chown=1", "touch=1", "kept", "files=0 env=0"} {
		if !strings.Contains(reply, want) {
			t.Errorf("reply lacks %q:\n%s", want, reply)
		}
	}
	if !strings.HasPrefix(handle, "kubernetes:"+c.ns+"/") {
		t.Errorf("handle %q, want kubernetes:<namespace>/<pod>", handle)
	}
	data := <-podJSON
	if strings.Contains(string(data), secret) || strings.Contains(string(data), "sk-berth-kube") {
		t.Fatalf("the key is in the pod as the API server has it:\n%s", data)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(data, &pod); err != nil {
		t.Fatal(err)
	}
	ctr := pod.Spec.Containers[0]
	sc := ctr.SecurityContext
	checks := []struct {
		what string
		ok   bool
	}{
		{"runAsNonRoot", sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && pod.Spec.SecurityContext.RunAsNonRoot != nil && *pod.Spec.SecurityContext.RunAsNonRoot},
		{"the plan's uid", sc.RunAsUser != nil && *sc.RunAsUser == 1879048200},
		{"readOnlyRootFilesystem", sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem},
		{"allowPrivilegeEscalation false", sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation},
		{"capabilities drop ALL", sc.Capabilities != nil && len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL" && len(sc.Capabilities.Add) == 0},
		{"seccomp RuntimeDefault", sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no service account token", pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken},
		{"memory limit 256Mi", ctr.Resources.Limits.Memory().Value() == 256<<20 && ctr.Resources.Requests.Memory().Value() == 256<<20},
		{"cpu limit 500m", ctr.Resources.Limits.Cpu().MilliValue() == 500},
		{"no command or args", len(ctr.Command) == 0 && len(ctr.Args) == 0},
		{"the minimal environment", len(ctr.Env) == len(kube.Environment()) && len(ctr.EnvFrom) == 0},
		{"labels", pod.Labels[kube.LabelRun] == s.RunID && pod.Labels[kube.LabelAttempt] == "1" && pod.Labels[kube.LabelAgent] == "tester" && pod.Labels[kube.LabelConfigHash] != ""},
		{"no annotations", len(pod.Annotations) == 0},
		{"not on the host's namespaces", !pod.Spec.HostNetwork && !pod.Spec.HostPID && !pod.Spec.HostIPC},
	}
	for _, ck := range checks {
		if !ck.ok {
			t.Errorf("%s: not so in the pod read back: %+v", ck.what, pod.Spec)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil {
			t.Errorf("volume %s is not an emptyDir: %+v", v.Name, v)
		}
		if v.Name == "tmp" && (v.EmptyDir.Medium != corev1.StorageMediumMemory || v.EmptyDir.SizeLimit.Value() != 64<<20) {
			t.Errorf("/tmp is not a 64Mi memory emptyDir: %+v", v.EmptyDir)
		}
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
	np, err := c.cs.NetworkingV1().NetworkPolicies(c.ns).Get(context.Background(), kube.PolicyName(kube.InstanceLabel(t.Name())), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the namespace's NetworkPolicy: %v", err)
	}
	if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 1 || np.Spec.Egress[0].To[0].IPBlock == nil || np.Spec.Egress[0].To[0].IPBlock.CIDR != testkube.BridgeIP+"/32" || len(np.Spec.Ingress) != 0 {
		t.Errorf("NetworkPolicy %+v: want egress to the router's address only and no ingress", np.Spec)
	}
}

// An image the node does not have fails the run with the image reason,
// without waiting for the run's timeout, and leaves no pod behind.
func TestKubernetesMissingImageFailsTheRunWithAReason(t *testing.T) {
	c := newCluster(t)
	image(t) // the probe runs first with a real image
	warm := c.spec(t, image(t), "/sh true")
	if _, err := run(t, c.b, warm); err != nil {
		t.Fatalf("a first run: %v", err)
	}
	s := c.spec(t, "berth-test/no-such-image:1", "/sh echo never")
	began := time.Now()
	_, err := run(t, c.b, s)
	if isolation.ReasonOf(err) != isolation.ReasonImageUnavailable || !strings.Contains(err.Error(), "berth-test/no-such-image:1") {
		t.Fatalf("run = %v, want %q naming the image", err, isolation.ReasonImageUnavailable)
	}
	if took := time.Since(began); took >= s.Timeout {
		t.Errorf("the run took %s, its whole timeout", took)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
}

// A pod that cannot be scheduled ends the run with a reason naming why.
func TestKubernetesUnschedulablePodEndsTheRunWithWhy(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	if _, err := run(t, c.b, c.spec(t, img, "/sh true")); err != nil {
		t.Fatalf("a first run: %v", err)
	}
	b, err := kube.New(kube.Options{Config: testkube.Config(t), Instance: t.Name(), Namespace: c.ns, ProxyHost: testkube.BridgeIP, StartTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := c.spec(t, img, "/sh echo never")
	s.Kube.NodeSelector = map[string]string{"berth.test/no-such-node": "x"}
	s.Kube.EgressVerifiedBy = "admin"
	_, err = run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "could not be scheduled") {
		t.Fatalf("run = %v, want %q saying it could not be scheduled", err, isolation.ReasonStart)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
}

// An API server that does not answer fails the run with its reason within
// the API deadline.
func TestKubernetesUnreachableAPIServerFailsTheRun(t *testing.T) {
	cfg := testkube.Config(t)
	cfg.Host = "https://" + testkube.BridgeIP + ":1" // nothing listens there
	b, err := kube.New(kube.Options{Config: cfg, Instance: t.Name(), Namespace: "berth", ProxyHost: testkube.BridgeIP, APITimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := cluster{ns: "berth", proxy: testkube.BridgeIP + ":17999"}
	s := c.spec(t, "berth-agent:any", "/sh true")
	s.Kube.EgressVerifiedBy = "admin"
	_, err = run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonClusterUnavailable {
		t.Fatalf("run = %v, want %q", err, isolation.ReasonClusterUnavailable)
	}
}

// A warm pod waits with no run and no request, and a run that takes it
// gets its reply from it.
func TestKubernetesWarmPodAnswers(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	tmpl := c.spec(t, img, "")
	tmpl.Kube.Warm = 1
	c.b.Warm([]isolation.Spec{tmpl})
	deadline := time.Now().Add(3 * time.Minute)
	for c.b.PoolSize("tester") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no warm pod became ready")
		}
		time.Sleep(200 * time.Millisecond)
	}
	pool := podsOf(t, c.cs, c.ns, kube.LabelPool+"=tester")
	if len(pool) != 1 || pool[0].Labels[kube.LabelRun] != "" {
		t.Fatalf("warm pods %+v: want one, with no run", pool)
	}
	if data, _ := json.Marshal(pool[0]); strings.Contains(string(data), secret) {
		t.Fatal("the warm pod holds a key")
	}
	s := c.spec(t, img, "/sh echo from $(hostname)")
	s.Kube.Warm = 1
	var handle string
	s.OnStart = func(h string) error { handle = h; return nil }
	res, err := run(t, c.b, s)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Stderr)
	}
	if want := "from " + pool[0].Name; !strings.Contains(res.Response.Reply, want) || !strings.HasSuffix(handle, "/"+pool[0].Name) {
		t.Fatalf("reply %q (handle %s), want it from the warm pod %s", res.Response.Reply, handle, pool[0].Name)
	}
}

// Sweep removes this instance's pods of runs that are not live, and warm
// pods of an earlier process, and leaves another instance's alone.
func TestKubernetesSweepRemovesAKilledSchedulersPods(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	if os.Getenv("CI") == "" {
		testenv.NeedRoot(t)
	}
	// A scheduler process that is SIGKILLed while its run's pod runs.
	handleFile := filepath.Join(t.TempDir(), "handle")
	s := c.spec(t, img, "/sh sleep 300")
	helper := exec.Command(os.Args[0], "-test.run=^$")
	data, err := json.Marshal(struct {
		Plan    isolation.Plan
		Request agentproto.Request
	}{s.Plan, s.Request})
	if err != nil {
		t.Fatal(err)
	}
	helper.Env = append(os.Environ(), helperEnv+"="+string(data), "BERTH_KUBE_HANDLE_FILE="+handleFile, "BERTH_KUBE_INSTANCE="+t.Name())
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(handleFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			helper.Process.Kill()
			t.Fatal("the helper scheduler never started its run's pod")
		}
		time.Sleep(100 * time.Millisecond)
	}
	helper.Process.Kill()
	helper.Wait()
	if n := len(podsOf(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)); n != 1 {
		t.Fatalf("%d pods of the killed scheduler's run, want 1 left behind", n)
	}
	other := newBackend(t, c.ns, "another scheduler")
	if removed, err := other.Sweep(context.Background(), nil); err != nil || len(removed) != 0 {
		t.Fatalf("another instance's sweep removed %v (%v)", removed, err)
	}
	next := newBackend(t, c.ns, t.Name())
	removed, err := next.Sweep(context.Background(), func(string, int) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != s.RunID {
		t.Fatalf("sweep removed %v (%v), want run %s", removed, err, s.RunID)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
	if err := next.Kill(context.Background(), "kubernetes:"+c.ns+"/berth-gone-pod"); err != nil {
		t.Errorf("Kill of a pod that is gone: %v", err)
	}
}

const helperEnv = "BERTH_KUBE_SWEEP_HELPER"

// TestMain runs the sweep test's scheduler process when asked to.
func TestMain(m *testing.M) {
	if data := os.Getenv(keepHelperEnv); data != "" {
		if err := runKeepHelper(data); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
	if data := os.Getenv(helperEnv); data != "" {
		if err := runSweepHelper(data); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runSweepHelper is the scheduler process the sweep test kills: it starts
// the run's pod, writes its handle and waits.
func runSweepHelper(data string) error {
	var in struct {
		Plan    isolation.Plan
		Request agentproto.Request
	}
	if err := json.Unmarshal([]byte(data), &in); err != nil {
		return err
	}
	cfg, err := testkube.Reachable()
	if err != nil {
		return err
	}
	s := isolation.Spec{Plan: in.Plan, Request: in.Request}
	b, err := kube.New(kube.Options{Config: cfg, Instance: os.Getenv("BERTH_KUBE_INSTANCE"), Namespace: s.Kube.Namespace, ProxyHost: testkube.BridgeIP})
	if err != nil {
		return err
	}
	s.OnStart = func(h string) error { return os.WriteFile(os.Getenv("BERTH_KUBE_HANDLE_FILE"), []byte(h), 0o600) }
	_, err = b.Run(context.Background(), s)
	return err
}

// A pod deleted under its run (a node lost, an eviction) ends the run
// with a reason at once.
func TestKubernetesPodDeletedUnderItsRunEndsIt(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	s := c.spec(t, img, "/sh sleep 300")
	s.OnStart = func(h string) error {
		go func() {
			name := h[strings.LastIndexByte(h, '/')+1:]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := c.cs.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete: %v", err)
			}
		}()
		return nil
	}
	began := time.Now()
	_, err := run(t, c.b, s)
	if err == nil || isolation.ReasonOf(err) == isolation.ReasonTimeout {
		t.Fatalf("run = %v, want it ended with a reason before its timeout", err)
	}
	if took := time.Since(began); took >= s.Timeout {
		t.Errorf("the run took %s, its whole timeout", took)
	}
}
