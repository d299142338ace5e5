package kube_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

var keptRuns atomic.Int64

// keptSpec is the opening spec of a conversation's sandbox on c: a plan
// whose run id is the sandbox's id, as runprep.PrepareKept makes it.
func (c cluster) keptSpec(t *testing.T, img string) isolation.Spec {
	s := c.spec(t, img, "")
	s.RunID = "sbx_" + s.RunID
	s.Request = agentproto.Request{Version: agentproto.Version, RunID: s.RunID, Agent: s.Request.Agent, Provider: s.Request.Provider}
	return s
}

func startKept(t *testing.T, b *kube.Backend, s isolation.Spec) isolation.Kept {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, s)
	if err != nil {
		t.Fatalf("cannot start the sandbox: %v", err)
	}
	t.Cleanup(func() { _ = k.Stop(context.Background(), 0) })
	return k
}

func keptRequest(text string) agentproto.Request {
	return agentproto.Request{
		RunID:   fmt.Sprintf("run-%d-%d", keptRuns.Add(1), os.Getpid()),
		Agent:   agentproto.Agent{ID: "tester", MaxIterations: 3},
		Message: agentproto.Message{ID: "m", Text: text},
	}
}

// keptShell runs "/sh command" as one request of k and returns the reply's lines.
func keptShell(t *testing.T, k isolation.Kept, command string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := k.Run(ctx, keptRequest("/sh "+command))
	if err != nil {
		t.Fatalf("run %q failed: %v\nstderr: %s", command, err, res.Stderr)
	}
	return strings.Split(res.Response.Reply, "\n")
}

func podName(handle string) string { return handle[strings.LastIndexByte(handle, '/')+1:] }

// Two messages of one conversation reach the same pod (the file the first
// left in /tmp is there for the second), another conversation gets a pod
// of its own that does not see it, and Stop deletes the pod.
func TestKubernetesConversationPodServesItsMessagesAndStops(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	s := c.keptSpec(t, img)
	var handle string
	s.OnStart = func(h string) error { handle = h; return nil }
	k := startKept(t, c.b, s)
	if k.Handle() != handle || !strings.HasPrefix(handle, "kubernetes:"+c.ns+"/") {
		t.Fatalf("handle %q (OnStart got %q), want kubernetes:<namespace>/<pod>", k.Handle(), handle)
	}
	pods := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
	if len(pods) != 1 || pods[0].Name != podName(handle) || pods[0].Labels[kube.LabelKept] != "1" ||
		pods[0].Spec.ShareProcessNamespace == nil || !*pods[0].Spec.ShareProcessNamespace {
		t.Fatalf("pods of the sandbox %+v: want its one kept pod, sharing its process namespace", pods)
	}
	if data, _ := json.Marshal(pods[0]); strings.Contains(string(data), secret) {
		t.Fatal("the kept pod holds the key")
	}

	first := keptShell(t, k, "echo state-of-one > /tmp/state; echo host=$(hostname)")
	second := keptShell(t, k, "cat /tmp/state; echo host=$(hostname)")
	host := "host=" + podName(handle)
	if !slices.Contains(first, host) || !slices.Contains(second, host) || !slices.Contains(second, "state-of-one") {
		t.Fatalf("the conversation's second message is not in its first one's pod %s:\n%q\n%q", host, first, second)
	}
	if k.Runs() != 2 {
		t.Errorf("Runs = %d, want 2", k.Runs())
	}

	other := startKept(t, c.b, c.keptSpec(t, img))
	got := keptShell(t, other, "cat /tmp/state 2>&1; echo host=$(hostname)")
	if slices.Contains(got, "state-of-one") || slices.Contains(got, host) || other.Handle() == k.Handle() {
		t.Fatalf("another conversation's message ran in the first one's pod or sees its /tmp:\n%q", got)
	}

	// memory_test.go proves what it measures.
	if mem, err := k.Memory(context.Background()); err != nil || mem <= 0 {
		t.Errorf("Memory = %d, %v; want the pod's working set", mem, err)
	}
	if err := k.Stop(context.Background(), 20*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case <-k.Done():
	default:
		t.Error("Done is not closed after Stop")
	}
	if left := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID); len(left) != 0 {
		t.Errorf("the stopped sandbox's pod is still there: %+v", left)
	}
	if _, err := k.Run(context.Background(), keptRequest("/sh echo after")); isolation.ReasonOf(err) != isolation.ReasonCrashed {
		t.Errorf("a run after Stop = %v, want %q", err, isolation.ReasonCrashed)
	}
	// The other conversation's sandbox is untouched.
	if got := keptShell(t, other, "echo still"); !slices.Contains(got, "still") {
		t.Errorf("the other sandbox after the first one's stop: %q", got)
	}
}

// keepHelperEnv makes the test binary a scheduler that opens a kept pod,
// prints its handle and waits to be killed.
const keepHelperEnv = "BERTH_KUBE_KEEP_HELPER"

type keepHelperOutcome struct {
	Handle, Sandbox, Error string
}

// runKeepHelper is the helper scheduler's main: data is the opening spec.
func runKeepHelper(data string) error {
	var in struct {
		Plan    isolation.Plan
		Request agentproto.Request
	}
	if err := json.Unmarshal([]byte(data), &in); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	cfg, err := testkube.Reachable()
	if err != nil {
		return err
	}
	s := isolation.Spec{Plan: in.Plan, Request: in.Request}
	b, err := kube.New(kube.Options{Config: cfg, Instance: os.Getenv("BERTH_KUBE_INSTANCE"), Namespace: s.Kube.Namespace, ProxyHost: testkube.BridgeIP})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, s)
	if err != nil {
		_ = out.Encode(keepHelperOutcome{Error: err.Error()})
		return err
	}
	if _, err := k.Run(ctx, keptRequest("/sh echo left > /tmp/left")); err != nil {
		_ = out.Encode(keepHelperOutcome{Error: err.Error()})
		return err
	}
	_ = out.Encode(keepHelperOutcome{Handle: k.Handle(), Sandbox: s.RunID})
	select {} // until the test kills this scheduler
}

// A scheduler that dies takes its attach stream with it: its kept pod's
// agent reads EOF and ends by itself, the pod is found again by its labels
// (the sweep leaves it while its sandbox id is live), and
// Kill with the recorded handle deletes it from a restarted scheduler.
func TestKubernetesKeptPodOfADeadSchedulerEndsAndIsFoundByItsLabels(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	if _, err := run(t, c.b, c.spec(t, img, "/sh true")); err != nil {
		t.Fatalf("a first run (the probe): %v", err)
	}
	s := c.keptSpec(t, img)
	s.Kube.EgressVerifiedBy = "admin" // the probe passed above
	data, err := json.Marshal(struct {
		Plan    isolation.Plan
		Request agentproto.Request
	}{s.Plan, s.Request})
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), keepHelperEnv+"="+string(data), "BERTH_KUBE_INSTANCE="+t.Name())
	helper.Stderr = os.Stderr
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	var got keepHelperOutcome
	derr := json.NewDecoder(bufio.NewReader(stdout)).Decode(&got)
	_ = helper.Process.Signal(syscall.SIGKILL)
	_ = helper.Wait()
	if derr != nil || got.Error != "" {
		t.Fatalf("helper scheduler: %+v (%v)", got, derr)
	}
	selector := kube.LabelKept + "=1," + kube.LabelRun + "=" + s.RunID + "," + kube.LabelInstance + "=" + kube.InstanceLabel(t.Name())
	found := podsOf(t, c.cs, c.ns, selector)
	if len(found) != 1 || found[0].Name != podName(got.Handle) {
		t.Fatalf("pods found by the sandbox's labels: %+v, want the helper's %s", found, got.Handle)
	}
	// The agent saw its stdin end with the dead scheduler's stream.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod, err := testkube.WaitPodDone(ctx, c.cs, c.ns, found[0].Name)
	if err != nil {
		t.Fatalf("the kept pod of a dead scheduler did not end by itself: %v", err)
	}
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Errorf("the kept pod ended %s (%+v), want its agent's exit 0 at EOF", pod.Status.Phase, pod.Status.ContainerStatuses)
	}

	restarted := newBackend(t, c.ns, t.Name())
	if removed, err := restarted.Sweep(context.Background(), func(run string, _ int) bool { return run == s.RunID }); err != nil || slices.Contains(removed, s.RunID) {
		t.Fatalf("the sweep removed a live sandbox's pod: %v (%v)", removed, err)
	}
	if len(podsOf(t, c.cs, c.ns, selector)) != 1 {
		t.Fatal("the live sandbox's pod is gone after the sweep")
	}
	if err := restarted.Kill(context.Background(), got.Handle); err != nil {
		t.Fatalf("Kill(%q): %v", got.Handle, err)
	}
	waitGone(t, c.cs, c.ns, selector)
	if err := restarted.Kill(context.Background(), got.Handle); err != nil {
		t.Errorf("a second Kill of a gone sandbox: %v", err)
	}
	_, err = c.cs.CoreV1().Pods(c.ns).Get(context.Background(), found[0].Name, metav1.GetOptions{})
	if err == nil {
		t.Error("the pod is still readable after Kill")
	}
}

// A kept pod is the run pod serving requests: berth-agent serve in the
// pod's shared process namespace (pause reaps), stdin closing with berth's
// attach session, labelled as a sandbox, no deadline of its own.
func TestKubernetesKeptPodForServes(t *testing.T) {
	c := cluster{ns: "berth", proxy: "10.231.0.1:17000"}
	s := c.keptSpec(t, "berth-agent:x")
	pod, err := kube.KeptPodFor(s, "i")
	if err != nil {
		t.Fatal(err)
	}
	ctr := pod.Spec.Containers[0]
	if !slices.Equal(ctr.Args, []string{agentproto.ServeArg, agentproto.ServePIDNamespaceArg}) || len(ctr.Command) != 0 || !ctr.Stdin || !ctr.StdinOnce {
		t.Errorf("container %+v: want serve --pid-namespace on a stdin that closes with the attach", ctr)
	}
	if pod.Spec.ShareProcessNamespace == nil || !*pod.Spec.ShareProcessNamespace || pod.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("pod spec %+v", pod.Spec)
	}
	if pod.Labels[kube.LabelKept] != "1" || pod.Labels[kube.LabelRun] != s.RunID || pod.Labels[kube.LabelAttempt] != "1" {
		t.Errorf("labels %v", pod.Labels)
	}
	if data, _ := json.Marshal(pod); strings.Contains(string(data), secret) {
		t.Error("the key is in the kept pod")
	}
}

// A request line with another policy than the sandbox's, written straight
// to its pod's stdin (by whoever may attach to it), is answered with an
// error and not run: a kept pod never widens. Control: the same line with
// the sandbox's own policy is run. The sandbox's next run then fails
// closed on the answers it did not ask for.
func TestKubernetesKeptPodRefusesARequestWithAnotherPolicy(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	s := c.keptSpec(t, img)
	k := startKept(t, c.b, s)
	keptShell(t, k, "echo opened")

	wider := s.Policy
	wider.AllowReadWrite = append(slices.Clone(wider.AllowReadWrite), "/")
	line := func(id string, p agentproto.Policy) string {
		req := agentproto.Request{Version: agentproto.Version, RunID: id, Agent: agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message: agentproto.Message{ID: id, Text: "/sh echo ran-" + id}, Provider: s.Request.Provider,
			Policy: p, Workspace: isolation.ContainerWorkspace}
		data, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return string(data) + "\n"
	}
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	cfg := testkube.Config(t)
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.ns).Name(podName(k.Handle())).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "agent", Stdin: true, Stdout: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: stdoutW})
		stdoutW.CloseWithError(fmt.Errorf("the test's attach ended: %v", err))
	}()
	answers := map[string]agentproto.Response{}
	lines := bufio.NewScanner(stdoutR)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for _, send := range []struct {
		id     string
		policy agentproto.Policy
	}{{"injected-wider", wider}, {"injected-same", s.Policy}} {
		go io.WriteString(stdinW, line(send.id, send.policy))
		for lines.Scan() {
			var resp agentproto.Response
			if json.Unmarshal(lines.Bytes(), &resp) == nil && resp.RunID == send.id {
				answers[send.id] = resp
				break
			}
		}
		if err := lines.Err(); err != nil {
			t.Fatalf("reading the pod's answers: %v", err)
		}
	}
	if a := answers["injected-wider"]; !strings.Contains(a.Error, "policy is not the sandbox's") || strings.Contains(a.Reply, "ran-injected-wider") {
		t.Errorf("the wider request was answered %+v, want it refused unrun", a)
	}
	if a := answers["injected-same"]; a.Error != "" || !strings.Contains(a.Reply, "ran-injected-same") {
		t.Fatalf("control: the same-policy request was answered %+v, want it run", a)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	if _, err := k.Run(rctx, keptRequest("/sh echo next")); isolation.ReasonOf(err) != isolation.ReasonBadResponse {
		t.Errorf("the sandbox's next run = %v, want %q (answers it did not ask for)", err, isolation.ReasonBadResponse)
	}
}
