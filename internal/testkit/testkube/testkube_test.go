package testkube_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-dev/berth/internal/testkit/testkube"
)

func TestNormalizeRef(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"busybox":                         "docker.io/library/busybox:latest",
		"berth-test/kube-busybox:1":       "docker.io/berth-test/kube-busybox:1",
		"localhost/x":                     "localhost/x:latest",
		"registry.example:5000/a/b:2":     "registry.example:5000/a/b:2",
		"registry.example:5000/a/b":       "registry.example:5000/a/b:latest",
		"berth/agent@sha256:0123456789ab": "docker.io/berth/agent@sha256:0123456789ab",
	} {
		if got := testkube.NormalizeRef(in); got != want {
			t.Errorf("NormalizeRef(%q) = %q, want %q", in, got, want)
		}
	}
}

// hardened is the pod security the Kubernetes backend gives agents; the test
// pods run with it too, so the cluster is proven to run such pods.
func hardened(image string, script string) *corev1.PodSpec {
	no, yes, nobody := false, true, int64(65534)
	return &corev1.PodSpec{
		RestartPolicy:                corev1.RestartPolicyNever,
		AutomountServiceAccountToken: &no,
		EnableServiceLinks:           &no,
		Containers: []corev1.Container{{
			Name:            "main",
			Image:           image,
			ImagePullPolicy: corev1.PullNever,
			Command:         []string{"/bin/sh", "-c", script},
			SecurityContext: &corev1.SecurityContext{
				RunAsUser:                &nobody,
				RunAsNonRoot:             &yes,
				ReadOnlyRootFilesystem:   &yes,
				AllowPrivilegeEscalation: &no,
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
		}},
	}
}

// runPod creates the pod, waits for it to finish and returns its phase and log.
func runPod(t *testing.T, cs kubernetes.Interface, ns, name string, spec *corev1.PodSpec) (corev1.PodPhase, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: *spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create pod %s: %v", name, err)
	}
	done, err := testkube.WaitPodDone(ctx, cs, ns, pod.Name)
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	logs, err := testkube.PodLogs(ctx, cs, ns, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	return done.Status.Phase, logs
}

func TestKubernetesClusterRunsAPod(t *testing.T) {
	cs := testkube.Clientset(t)
	image := testkube.Busybox(t)
	ns := testkube.Namespace(t, cs)

	phase, logs := runPod(t, cs, ns, "hello", hardened(image, "echo hello from $(id -u); cat /proc/1/status | grep ^CapEff; touch /x 2>/dev/null && echo root-writable || echo root-read-only"))
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod ended %s, log:\n%s", phase, logs)
	}
	want := "hello from 65534\nCapEff:\t0000000000000000\nroot-read-only\n"
	if logs != want {
		t.Fatalf("pod log = %q, want %q", logs, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", "hello").String()
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "hello", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("cannot delete the pod: %v", err)
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Deleted {
			break
		}
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "hello", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod is still there after its deletion: %v", err)
	}
}

// A pod reaches the host only at the bridge address and on the ports kept for
// host listeners (where berth's egress proxy listens for the Kubernetes
// backend), with its own pod address as the source (no masquerade); another
// port there is refused, and it has no default route, so the machine's primary
// address, and every address beyond it, is unreachable.
func TestKubernetesPodsReachOnlyTheBridgeAddress(t *testing.T) {
	cs := testkube.Clientset(t)
	image := testkube.Busybox(t)
	ns := testkube.Namespace(t, cs)

	allowedURL, allowedFrom := serve(t, testkube.ListenForPods(t))
	otherURL, otherFrom := serve(t, listen(t, testkube.BridgeIP)) // an ephemeral port, outside the range
	primaryURL, primaryFrom := serve(t, listen(t, primaryIP(t)))

	// busybox nc, not wget: Debian's static busybox wget crashes in an
	// image without /etc/passwd.
	get := func(url string) string {
		hostport := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
		host, port, _ := net.SplitHostPort(hostport)
		return fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 %s %s | grep -q listener-answered`, host, port)
	}
	script := fmt.Sprintf(`cat /proc/net/route
%s && echo allowed-reached || echo allowed-unreachable
%s && echo other-port-reached || echo other-port-unreachable
%s && echo primary-reached || echo primary-unreachable`, get(allowedURL), get(otherURL), get(primaryURL))
	phase, logs := runPod(t, cs, ns, "reach", hardened(image, script))
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod ended %s, log:\n%s", phase, logs)
	}
	if !strings.Contains(logs, "\nallowed-reached\n") {
		t.Errorf("the pod did not reach the listener on %s:\n%s", allowedURL, logs)
	}
	if !strings.Contains(logs, "\nother-port-unreachable\n") {
		t.Errorf("the pod reached %s, a bridge port outside %d-%d:\n%s", otherURL, testkube.HostPortMin, testkube.HostPortMax, logs)
	}
	if !strings.Contains(logs, "\nprimary-unreachable") {
		t.Errorf("the pod reached the machine's primary address %s:\n%s", primaryURL, logs)
	}
	for _, line := range strings.Split(logs, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "00000000" {
			t.Errorf("the pod has a default route: %q\n%s", line, logs)
		}
	}
	select {
	case from := <-allowedFrom:
		if ip := net.ParseIP(from); ip == nil || !podNet.Contains(ip) {
			t.Errorf("the host listener saw the pod come from %s, not from a pod address in %s (masqueraded?)", from, podNet)
		}
	default:
		t.Errorf("the host listener got no request")
	}
	for name, ch := range map[string]<-chan string{"the other bridge port": otherFrom, "the primary address": primaryFrom} {
		select {
		case from := <-ch:
			t.Errorf("the listener on %s got a request from %s", name, from)
		default:
		}
	}
}

func listen(t *testing.T, ip string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("cannot listen on %s: %v", ip, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

var _, podNet, _ = net.ParseCIDR("10.231.0.0/24")

// primaryIP is the source address of this machine's default route (a UDP
// "connection" picks it without sending anything).
func primaryIP(t *testing.T) string {
	t.Helper()
	c, err := net.Dial("udp4", "192.0.2.1:9")
	if err != nil {
		t.Fatalf("cannot find the machine's primary address: %v", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// serve answers "listener-answered" on ln and reports each request's source address.
func serve(t *testing.T, ln net.Listener) (string, <-chan string) {
	t.Helper()
	from := make(chan string, 16)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		select {
		case from <- host:
		default:
		}
		fmt.Fprintln(w, "listener-answered")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/", from
}
