package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation/kube"
)

// Issue 23 through the real daemons: berth-intake socket-activated,
// berth-scheduler D-Bus-activated, agents with backend = "kubernetes" on
// the test cluster (scripts/kube-cluster.sh), their image berth-agent's
// isolation image loaded into the cluster's containerd (imagePullPolicy
// Never). Without a reachable cluster these fail under CI=true and skip
// elsewhere (testkube.Config).

// kubeEnv is one test's part of the cluster: a fresh namespace, the
// router's address pods reach, and the agent image the nodes have.
type kubeEnv struct {
	cs         *kubernetes.Clientset
	ns         string
	kubeconfig string
	proxy      string
	image      string
}

var kubeAgentImage struct {
	once sync.Once
	tag  string
	err  error
}

func newKubeEnv(t testing.TB) kubeEnv {
	t.Helper()
	testkube.Config(t) // fails under CI=true with no cluster
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	cli := testdocker.Engine(t)
	kubeAgentImage.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		kubeAgentImage.tag, kubeAgentImage.err = imagectl.Ensure(ctx, cli, imagectl.AgentImage{AgentBinary: filepath.Join(binDir, "berth-agent")})
	})
	if kubeAgentImage.err != nil {
		t.Fatalf("cannot build the agent image: %v", kubeAgentImage.err)
	}
	testkube.LoadImage(t, kubeAgentImage.tag)
	path, err := testkube.KubeconfigPath()
	if err != nil {
		t.Fatal(err)
	}
	cs := testkube.Clientset(t)
	ln := testkube.ListenForPods(t)
	proxy := ln.Addr().String()
	ln.Close() // the scheduler's router listens there
	return kubeEnv{cs: cs, ns: testkube.Namespace(t, cs), kubeconfig: path, proxy: proxy, image: kubeAgentImage.tag}
}

// table is the [kubernetes] table of a suite on k.
func (k kubeEnv) table(extra string) string {
	return fmt.Sprintf("\n[kubernetes]\nkubeconfig = %q\nnamespace = %q\nproxy_listen = %q\nimage_pull_policy = \"Never\"\nhost_id = \"e2e-host\"\n%s\n", k.kubeconfig, k.ns, k.proxy, extra)
}

// agent is the TOML of a kubernetes agent running image.
func kubeAgent(image string) string {
	return fmt.Sprintf("backend = \"kubernetes\"\ncontainer_mode = { image = %q, memory_limit = \"256m\", timeout_seconds = 120 }", image)
}

// startKube is a suite of one kubernetes agent on the local provider.
func startKube(t *testing.T, k kubeEnv, agent, image, kubeExtra string) *suite {
	t.Helper()
	sink := newReplySink(t)
	cfg := suiteConfig([]agentSpec{{id: agent, extra: kubeAgent(image)}}, sink.srv.URL+"/replies") + k.table(kubeExtra)
	return startShort(t, sink, cfg)
}

// podsOf is the pods of selector in ns that are not being deleted.
func kubePods(t *testing.T, cs kubernetes.Interface, ns, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("cannot list pods: %v", err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// waitPods waits until the pods of selector satisfy ok.
func waitPods(t *testing.T, cs kubernetes.Interface, ns, selector, what string, ok func([]corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pods := kubePods(t, cs, ns, selector)
		if ok(pods) {
			return pods
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 3 minutes (pods %s: %d)", what, selector, len(pods))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recordPods keeps every pod of ns as the API server first had it (the
// watch's Added events: the spec as created), so a test can read a run's
// pod back even after it is deleted.
func recordPods(t *testing.T, cs kubernetes.Interface, ns string) func() []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("cannot watch pods: %v", err)
	}
	var mu sync.Mutex
	var seen []corev1.Pod
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				mu.Lock()
				seen = append(seen, *p)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return func() []corev1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return append([]corev1.Pod(nil), seen...)
	}
}

func podOfRun(pods []corev1.Pod, runID string) *corev1.Pod {
	for i := range pods {
		if pods[i].Labels[kube.LabelRun] == runID {
			return &pods[i]
		}
	}
	return nil
}

// A webhook message to a kubernetes agent gets its reply from a pod that
// ran berth-agent as a non-root uid on a read-only root with no
// capabilities; the pod carries the host's label and is gone afterwards.
func TestKubernetesMessageGetsItsReplyFromAHardenedPod(t *testing.T) {
	k := newKubeEnv(t)
	pods := recordPods(t, k.cs, k.ns)
	s := startKube(t, k, "kpod", k.image, "")
	// No capabilities is read from the pod as created (below): berth-agent's
	// Landlock domain keeps a tool out of /proc/self/status.
	id := s.mustPost(t, "kpod", "/sh echo uid=$(id -u) host=$(hostname); touch /bin/x 2>/dev/null; echo rootwrite=$?")
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	got := text(reply)
	runID, _ := reply["run_id"].(string)
	if reply["state"] != "succeeded" {
		t.Fatalf("state %v error %v reply %q", reply["state"], reply["error"], got)
	}
	pod := podOfRun(pods(), runID)
	if pod == nil {
		t.Fatalf("no pod of run %s was created in %s", runID, k.ns)
	}
	for _, want := range []string{"host=" + pod.Name, "rootwrite=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("reply lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "uid=0") {
		t.Errorf("the agent ran as root: %q", got)
	}
	sc := pod.Spec.Containers[0].SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("the pod's security context as created: %+v", sc)
	}
	if pod.Labels[kube.LabelHost] != "e2e-host" || pod.Labels[kube.LabelAgent] != "kpod" {
		t.Errorf("pod labels %v: want berth.host=e2e-host and berth.agent=kpod", pod.Labels)
	}
	if run := s.getRun(t, runID); run.Backend != "kubernetes" {
		t.Errorf("the run record's backend is %q, want kubernetes", run.Backend)
	}
	waitPods(t, k.cs, k.ns, kube.LabelRun+"="+runID, "the run's pod deleted after its reply", func(p []corev1.Pod) bool { return len(p) == 0 })
}

// The provider key stays in berth-egress on the host: it is not in the
// pod's spec or env as the API server has them, and a tool searching the
// pod's files, every process's environment and command line finds it
// nowhere (the control: the same search finds a marker the tool wrote to
// /tmp, and the proxy variable in its environment). A tool's request to a host no rule allows gets the proxy's 403
// and the run record names the reason; a direct connection (no proxy) to a
// listener on the host's own address fails.
func TestKubernetesKeyStaysOutOfThePodAndRefusedHostsGetThe403(t *testing.T) {
	k := newKubeEnv(t)
	pods := recordPods(t, k.cs, k.ns)
	direct := hostListener(t)
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithEgress(t, claude, gpt, `
[[agents]]
id = "kegress"
max_iterations = 4
`+kubeAgent(k.image)+`

[[bindings]]
connector = "hooks"
channel_id = "kegress"
agent = "kegress"
`+k.table(""))
	half := len(fakeKey) / 2
	// The key is searched for by its halves joined in the shell, so the
	// command's own text does not hold it; the control marker the same way,
	// written to /tmp first: the search must find it there.
	script := fmt.Sprintf(`run A=%q; B=%q; K="$A$B"; M="ctl-""marker"; echo "$M" > /tmp/ctl; `+
		`R="/tmp /workspace /run /etc /home /bin"; `+
		`echo files=$(grep -rl -e "$K" $R 2>/dev/null | grep -v -e ^/proc -e ^/sys | sort -u | wc -l) ctl=$(grep -rl -e "$M" $R 2>/dev/null | grep -v -e ^/proc -e ^/sys | sort -u | wc -l); `+
		`echo env=$(env | grep -c -e "$K") proxy=$(env | grep -c -e ^HTTP_PROXY=); `+
		`echo procs=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c -e "$K"); `+
		// busybox nc, not wget (the static busybox's resolver crashes); the
		// tool keeps its side open until the proxy answered.
		`P=${HTTP_PROXY#http://}; P=${P%%/}; (printf 'GET http://files.example/x HTTP/1.0\r\nHost: files.example\r\n\r\n'; sleep 3) | nc -w 5 ${P%%:*} ${P##*:} 2>&1 | head -c 300; echo; `+
		`nc -w 3 %s </dev/null >/dev/null 2>&1; echo direct=$?`, fakeKey[:half], fakeKey[half:], strings.Replace(direct.addr, ":", " ", 1))
	id := s.mustPost(t, "kegress", script)
	reply := s.sink.wait(t, 3*time.Minute, id)[id] // the first run in a namespace waits for the probe pod too
	got := text(reply)
	runID, _ := reply["run_id"].(string)
	if reply["state"] != "succeeded" {
		t.Fatalf("state %v error %v reply %q", reply["state"], reply["error"], got)
	}
	// The tool's request to a host no rule allows gets berth-egress's 403
	// with its reason, through berth-agent's listener and the router.
	for _, want := range []string{"files=0 ctl=1", "env=0 proxy=1", "procs=0", " 403 Forbidden", "X-Berth-Egress: refused", "no [agents.egress] allow rule matches GET files.example:80"} {
		if !strings.Contains(got, want) {
			t.Errorf("reply lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "direct=0") || !strings.Contains(got, "direct=") {
		t.Errorf("a direct connection from the pod did not fail:\n%s", got)
	}
	if direct.hits() != 0 {
		t.Errorf("the host listener got %d connections from the pod", direct.hits())
	}
	pod := podOfRun(pods(), runID)
	if pod == nil {
		t.Fatalf("no pod of run %s", runID)
	}
	data, _ := json.Marshal(pod)
	if strings.Contains(string(data), fakeKey) || strings.Contains(string(data), anthropicKey) {
		t.Fatalf("a provider key is in the pod as the API server had it:\n%s", data)
	}
	// The run record keeps the refusal, with its reason.
	if rec := s.getRun(t, runID).Egress.Text; !strings.Contains(rec, `"files.example"`) || !strings.Contains(rec, `"allowed":false`) {
		t.Errorf("the run record has no refused decision for files.example: %s", rec)
	}
	out, err := s.berthctl(t, "runs", "show", runID)
	if err != nil {
		t.Fatalf("berthctl runs show: %v\n%s", err, out)
	}
	gpt.mu.Lock()
	for _, auth := range gpt.auths {
		if auth != "Bearer "+fakeKey {
			t.Errorf("the provider got Authorization %q, want the key berth-egress adds on the host", auth)
		}
	}
	calls := len(gpt.auths)
	gpt.mu.Unlock()
	if calls == 0 {
		t.Error("the provider got no call from the pod's run")
	}
	s.noKeyInRuns(t, fakeKey, anthropicKey)
}

// hostListener listens on this machine's primary address: a pod must not
// reach it.
type listenerHits struct {
	addr string
	mu   sync.Mutex
	n    int
}

func (l *listenerHits) hits() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func hostListener(t *testing.T) *listenerHits {
	t.Helper()
	ip := primaryIPv4(t)
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	l := &listenerHits{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.n++
		l.mu.Unlock()
	}), ConnState: func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			l.mu.Lock()
			l.n++
			l.mu.Unlock()
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return l
}

func primaryIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil || n.IP.IsLoopback() || strings.HasPrefix(n.IP.String(), "10.231.") || strings.HasPrefix(n.IP.String(), "172.17.") {
			continue
		}
		return n.IP.String()
	}
	t.Fatal("this machine has no primary IPv4 address")
	return ""
}

// An image the node does not have fails the run at once with the image
// reason, and the reply says so; no pod of the run is left.
func TestKubernetesMissingImageFailsTheRunAndTheReplySaysSo(t *testing.T) {
	k := newKubeEnv(t)
	const missing = "berth-e2e/no-such-image:1"
	s := startKube(t, k, "knoimage", missing, "egress_verified_by = \"admin\"")
	id := s.mustPost(t, "knoimage", "/sh echo never")
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	runID, _ := reply["run_id"].(string)
	errText, _ := reply["error"].(string)
	if reply["state"] != "failed" || !strings.Contains(errText+text(reply), "container image unavailable") || !strings.Contains(errText+text(reply), missing) {
		t.Fatalf("state %v error %q reply %q: want a failure naming %q and the image", reply["state"], errText, text(reply), "container image unavailable")
	}
	if run := s.getRun(t, runID); run.Reason != "container image unavailable" {
		t.Errorf("run reason %q", run.Reason)
	}
	waitPods(t, k.cs, k.ns, kube.LabelRun+"="+runID, "no pod of the failed run", func(p []corev1.Pod) bool { return len(p) == 0 })
}

// The scheduler SIGKILLed while a run's pod runs: the pod outlives it
// (nobody else ends it), and the restarted scheduler removes it and runs
// the message again (orphan rules: an interrupted run is queued again
// under its id, attempt 2), which gets its reply; no pod of the run is
// left after.
func TestKubernetesSchedulerKilledMidRunLeavesNoPodAndTheMessageIsAnswered(t *testing.T) {
	k := newKubeEnv(t)
	s := startKube(t, k, "kcrash", k.image, "")
	id := s.mustPost(t, "kcrash", "/sh sleep 6; echo finished in $(hostname)")
	first := waitPods(t, k.cs, k.ns, kube.LabelAgent+"=kcrash", "a running pod of the run", func(p []corev1.Pod) bool {
		return len(p) == 1 && p[0].Labels[kube.LabelRun] != "" && p[0].Status.Phase == corev1.PodRunning
	})[0]
	runID := first.Labels[kube.LabelRun]
	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if left := kubePods(t, k.cs, k.ns, kube.LabelRun+"="+runID+","+kube.LabelAttempt+"="+first.Labels[kube.LabelAttempt]); len(left) != 1 {
		t.Fatalf("%d pods of the killed scheduler's attempt, want its pod still there", len(left))
	}
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}
	waitPods(t, k.cs, k.ns, kube.LabelRun+"="+runID+","+kube.LabelAttempt+"="+first.Labels[kube.LabelAttempt], "the killed attempt's pod removed by the restarted scheduler",
		func(p []corev1.Pod) bool { return len(p) == 0 })
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	if reply["state"] != "succeeded" || !strings.Contains(text(reply), "finished in ") || strings.Contains(text(reply), first.Name) {
		t.Fatalf("state %v error %v reply %q: want the message answered by a new attempt's pod", reply["state"], reply["error"], text(reply))
	}
	if run := s.getRun(t, runID); run.Attempts < 2 {
		t.Errorf("the run record counts %d attempts, want the interrupted one and its retry", run.Attempts)
	}
	waitPods(t, k.cs, k.ns, kube.LabelRun+"="+runID, "no pod of the run after its reply", func(p []corev1.Pod) bool { return len(p) == 0 })
	if s.sink.replies(id) != 1 {
		t.Errorf("%d replies to the message, want 1", s.sink.replies(id))
	}
}

// With warm = 1 a pod waits with no run before the message; the message
// gets its reply from that pod, a replacement starts, and a scheduler stop
// drains the pool.
func TestKubernetesWarmPodAnswers(t *testing.T) {
	k := newKubeEnv(t)
	s := startKube(t, k, "kwarm", k.image, "warm = 1")
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler: %v", err)
	}
	ready := func(p []corev1.Pod) bool {
		return len(p) == 1 && p[0].Status.Phase == corev1.PodRunning && p[0].Labels[kube.LabelRun] == ""
	}
	warm := waitPods(t, k.cs, k.ns, kube.LabelPool+"=kwarm", "a warm pod", ready)[0]
	id := s.mustPost(t, "kwarm", "/sh echo from $(hostname)")
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	if reply["state"] != "succeeded" || !strings.Contains(text(reply), "from "+warm.Name) {
		t.Fatalf("state %v error %v reply %q: want it from the warm pod %s", reply["state"], reply["error"], text(reply), warm.Name)
	}
	waitPods(t, k.cs, k.ns, kube.LabelPool+"=kwarm", "a replacement warm pod", func(p []corev1.Pod) bool {
		return ready(p) && p[0].Name != warm.Name
	})
	if err := s.KillService(bus.SchedulerName, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitPods(t, k.cs, k.ns, kube.LabelAgent+"=kwarm", "the pool drained at stop", func(p []corev1.Pod) bool { return len(p) == 0 })
}
