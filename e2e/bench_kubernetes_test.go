package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation/kube"
)

// Benchmarks of the Kubernetes backend on the test cluster (docs/scale.md,
// docs/benchmarks.md):
//
//	go test ./e2e -run '^$' -bench '^BenchmarkKubernetes' -benchtime 10x
//
// BenchmarkKubernetesPodCreateToReady is the cluster's own cost: a hardened
// busybox pod created with client-go until its container runs (pods/s);
// the other two are POST → reply through the real daemons, from a warm pod
// and from a pod created for the message.

func BenchmarkKubernetesPodCreateToReady(b *testing.B) {
	cs := testkube.Clientset(b)
	ns := testkube.Namespace(b, cs)
	img := testkube.Busybox(b)
	var took []time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("bench-%d", i)
		began := time.Now()
		if err := runningPod(cs, ns, name, img); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(began))
		b.StopTimer()
		_ = cs.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		b.StartTimer()
	}
	p50 := ms(quantile(took, 0.5))
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(ms(quantile(took, 0.95)), "p95-ms")
	b.ReportMetric(1000/p50, "pods/s")
}

// runningPod creates a pod hardened as berth's and waits until it runs.
func runningPod(cs kubernetes.Interface, ns, name, img string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	yes, no, uid := true, false, int64(65534)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: new(int64),
		Containers: []corev1.Container{{Name: "c", Image: img, ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sleep", "600"},
			SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &yes, ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no,
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}}},
	}}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: created.ResourceVersion})
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted {
			for _, st := range p.Status.ContainerStatuses {
				if st.State.Running != nil {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("pod %s/%s did not run: %w", ns, name, ctx.Err())
}

// benchKube is a suite of one kubernetes agent for the reply benchmarks.
func benchKube(b *testing.B, warm int) (*devstack.Stack, *fastSink, kubeEnv) {
	b.Helper()
	testenv.NeedRoot(b)
	k := newKubeEnv(b)
	sink := newFastSink(b)
	cfg := suiteConfig([]agentSpec{{id: "kbench", extra: kubeAgent(k.image)}}, sink.srv.URL+"/replies") + k.table(fmt.Sprintf("warm = %d", warm))
	dir, err := os.MkdirTemp("/tmp", "bk-") // short: egress socket paths
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	st, err := devstack.Start(devstack.Options{BinDir: binDir, Dir: dir, Config: cfg})
	if err != nil {
		b.Fatalf("cannot start the suite: %v", err)
	}
	b.Cleanup(st.Stop)
	return st, sink, k
}

// BenchmarkKubernetesReplyFromAWarmPod is POST → reply when a warm pod
// waits for the message (between messages, outside the timer, the pool
// starts the next one).
func BenchmarkKubernetesReplyFromAWarmPod(b *testing.B) {
	st, sink, k := benchKube(b, 1)
	benchReplies(b, st, sink, func() {
		waitPodsB(b, k.cs, k.ns, kube.LabelPool+"=kbench", func(p []corev1.Pod) bool {
			return len(p) == 1 && p[0].Status.Phase == corev1.PodRunning && p[0].Labels[kube.LabelRun] == ""
		})
	})
}

// BenchmarkKubernetesReplyFromAColdPod is POST → reply with no warm pod:
// the pod is created for the message.
func BenchmarkKubernetesReplyFromAColdPod(b *testing.B) {
	st, sink, k := benchKube(b, 0)
	benchReplies(b, st, sink, func() {
		waitPodsB(b, k.cs, k.ns, kube.LabelAgent+"=kbench", func(p []corev1.Pod) bool { return len(p) == 0 })
	})
}

func benchReplies(b *testing.B, st *devstack.Stack, sink *fastSink, between func()) {
	// One message outside the timer: the probe pod and the namespace's
	// set-up are a start's cost, not a message's.
	first := postText(b, st, "kbench", "/sh echo first")
	waitFor(b, sink.expect(first), "the first message")
	var took []time.Duration
	for b.Loop() {
		b.StopTimer()
		between()
		b.StartTimer()
		began := time.Now()
		id := postText(b, st, "kbench", "/sh echo bench")
		waitFor(b, sink.expect(id), id)
		took = append(took, time.Since(began))
	}
	b.StopTimer()
	sink.failures(b)
	b.ReportMetric(ms(quantile(took, 0.5)), "p50-ms")
	b.ReportMetric(ms(quantile(took, 0.95)), "p95-ms")
}

func waitPodsB(b *testing.B, cs kubernetes.Interface, ns, selector string, ok func([]corev1.Pod) bool) {
	b.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		list, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			b.Fatal(err)
		}
		var live []corev1.Pod
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if ok(live) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pods %s: not as wanted within 3 minutes", selector)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
