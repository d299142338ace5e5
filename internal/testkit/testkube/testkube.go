// Package testkube gives tests a real Kubernetes cluster: the one KUBECONFIG
// names, or else the single-node cluster scripts/kube-cluster.sh runs on this
// machine (docs/dev/kubernetes.md). Without a reachable cluster a test fails
// under CI=true and skips elsewhere (testenv).
package testkube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// ContainerdSocket is the socket of the containerd that scripts/kube-cluster.sh
// runs for its kubelet (never dockerd's). BERTH_KUBE_CONTAINERD overrides it
// for a cluster of another making whose node runtime is on this machine.
const ContainerdSocket = "/run/berth-kube/containerd/containerd.sock"

// BridgeIP is the host's address on the cluster's pod bridge: the only
// address outside its own pod that a pod reaches (no default route, no
// masquerade). A host listener pods must reach binds here (scripts/kube-cluster.sh
// KUBE_BRIDGE_IP; pods are in 10.231.0.0/24).
const BridgeIP = "10.231.0.1"

// HostPortMin and HostPortMax bound the TCP ports pods may reach at BridgeIP
// (scripts/kube-cluster.sh KUBE_HOST_PORTS); anything else a pod sends the
// host is refused, so host services on wildcard addresses stay out of reach.
const (
	HostPortMin = 17000
	HostPortMax = 17999
)

// ListenForPods listens on BridgeIP at a free port pods may reach
// (HostPortMin..HostPortMax); the listener is closed when the test ends.
func ListenForPods(t testing.TB) net.Listener {
	t.Helper()
	var last error
	// A test may close the listener and have a scheduler listen there
	// later: a port is handed out once per process, and each process
	// starts at a port of its own, so that two tests (in one binary or two
	// run at once) are not given the same free port in between.
	n := HostPortMax - HostPortMin + 1
	start := rand.IntN(n)
	for i := range n {
		port := HostPortMin + (start+i)%n
		if _, given := handedPorts.LoadOrStore(port, true); given {
			continue
		}
		ln, err := net.Listen("tcp4", net.JoinHostPort(BridgeIP, strconv.Itoa(port)))
		if err == nil {
			t.Cleanup(func() { ln.Close() })
			return ln
		}
		last = err
	}
	testenv.Need(t, false, "cannot listen for pods on %s:%d-%d (is scripts/kube-cluster.sh up?): %v", BridgeIP, HostPortMin, HostPortMax, last)
	return nil
}

// handedPorts are the ports ListenForPods gave out in this process.
var handedPorts sync.Map

// callTimeout bounds every API and engine call the helpers make.
const callTimeout = 30 * time.Second

// RepoRoot is the repository's top directory (where scripts/ lives).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// KubeconfigPath is the kubeconfig the tests use: $KUBECONFIG when set, else
// the file `scripts/kube-cluster.sh env` names when that cluster is up, else "".
func KubeconfigPath() (string, error) {
	if p := os.Getenv("KUBECONFIG"); p != "" {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(RepoRoot(), "scripts", "kube-cluster.sh"), "env").Output()
	if err != nil {
		return "", fmt.Errorf("KUBECONFIG is not set and scripts/kube-cluster.sh env says the test cluster is not up: %w", err)
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "KUBECONFIG=")
	if !ok || p == "" {
		return "", fmt.Errorf("scripts/kube-cluster.sh env printed %q, not KUBECONFIG=path", out)
	}
	return p, nil
}

// Config returns a client config for the test cluster, after checking that
// its API server answers. No cluster: the test fails under CI=true, skips elsewhere.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	cfg, err := Reachable()
	testenv.Need(t, err == nil, "no reachable Kubernetes cluster (set KUBECONFIG or run scripts/kube-cluster.sh up): %v", err)
	return cfg
}

// Clientset is Config's typed client.
func Clientset(t testing.TB) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(Config(t))
	if err != nil {
		t.Fatalf("cannot make a Kubernetes client: %v", err)
	}
	return cs
}

// Reachable is the client config of the cluster Config names once its API
// server answers /readyz, for a helper process that has no testing.T.
func Reachable() (*rest.Config, error) {
	path, err := KubeconfigPath()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("cannot load kubeconfig %s: %w", path, err)
	}
	cfg.Timeout = callTimeout
	probe := rest.CopyConfig(cfg)
	probe.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(probe)
	if err != nil {
		return nil, fmt.Errorf("cannot make a client for %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		return nil, fmt.Errorf("the API server of %s (%s) is not ready: %w", path, cfg.Host, err)
	}
	return cfg, nil
}

// Namespace creates a fresh namespace that is deleted when the test ends, and
// waits for its default service account (pods cannot be created before it).
func Namespace(t testing.TB, cs kubernetes.Interface) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "berth-test-",
		Labels:       map[string]string{"berth.dev/test": "true"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot create a test namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		// Pods first with no grace, so the namespace goes without waiting on them.
		zero := int64(0)
		err := cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cannot delete the pods of namespace %s: %v", ns.Name, err)
		}
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cannot delete namespace %s: %v", ns.Name, err)
		}
	})
	if err := waitServiceAccount(ctx, cs, ns.Name, "default"); err != nil {
		t.Fatalf("namespace %s: %v", ns.Name, err)
	}
	return ns.Name
}

func waitServiceAccount(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	list, err := cs.CoreV1().ServiceAccounts(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("cannot list service accounts: %w", err)
	}
	if len(list.Items) > 0 {
		return nil
	}
	w, err := cs.CoreV1().ServiceAccounts(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return fmt.Errorf("cannot watch service accounts: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("service account %s never appeared: %w", name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("the watch of service account %s ended", name)
			}
			if ev.Type == watch.Added {
				return nil
			}
		}
	}
}

// LoadImage loads the local Docker image (a name Docker knows) into the test
// cluster's containerd, in the namespace the kubelet uses, so pods with
// imagePullPolicy Never run it: docker save | ctr images import. It is
// skipped when containerd already has the image under that name with the same
// Docker image id (a label the import sets).
func LoadImage(t testing.TB, image string) {
	t.Helper()
	Config(t)
	sock := os.Getenv("BERTH_KUBE_CONTAINERD")
	if sock == "" {
		sock = ContainerdSocket
	}
	_, err := os.Stat(sock)
	testenv.Need(t, err == nil, "cannot load images: no containerd socket at %s (set BERTH_KUBE_CONTAINERD): %v", sock, err)
	if err := loadImage(sock, image); err != nil {
		t.Fatalf("cannot load image %s into the cluster: %v", image, err)
	}
}

const idLabel = "dev.berth.docker-image-id"

func loadImage(sock, image string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Id}}", image).Output()
	if err != nil {
		return fmt.Errorf("docker image inspect: %w%s", err, stderrOf(err))
	}
	id := strings.TrimSpace(string(out))
	ref := NormalizeRef(image)
	ctr := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
	}
	if have, err := ctr("images", "ls", "name=="+ref).Output(); err != nil {
		return fmt.Errorf("ctr images ls: %w%s", err, stderrOf(err))
	} else if hasLabel(have, ref, idLabel+"="+id) {
		return nil
	}
	save := exec.CommandContext(ctx, "docker", "save", image)
	imp := ctr("images", "import", "-")
	pipe, err := save.StdoutPipe()
	if err != nil {
		return err
	}
	var saveErr, impErr bytes.Buffer
	save.Stderr = &saveErr
	imp.Stdin = pipe
	imp.Stderr = &impErr
	if err := save.Start(); err != nil {
		return fmt.Errorf("docker save: %w", err)
	}
	ierr := imp.Run()
	serr := save.Wait()
	if serr != nil {
		return fmt.Errorf("docker save: %w: %s", serr, strings.TrimSpace(saveErr.String()))
	}
	if ierr != nil {
		return fmt.Errorf("ctr images import: %w: %s", ierr, strings.TrimSpace(impErr.String()))
	}
	if out, err := ctr("images", "label", ref, idLabel+"="+id).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images label %s: %w: %s", ref, err, out)
	}
	return nil
}

// hasLabel reads `ctr images ls` output (REF TYPE DIGEST SIZE PLATFORMS LABELS).
func hasLabel(ls []byte, ref, label string) bool {
	sc := bufio.NewScanner(bytes.NewReader(ls))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != ref {
			continue
		}
		for _, l := range strings.Split(f[len(f)-1], ",") {
			if l == label {
				return true
			}
		}
	}
	return false
}

// NormalizeRef spells an image name as containerd stores it and the kubelet
// looks it up: docker.io/library/busybox:latest for busybox.
func NormalizeRef(image string) string {
	name, digest, hasDigest := strings.Cut(image, "@")
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash || !strings.ContainsAny(first, ".:") && first != "localhost" {
		if !hasSlash {
			name = "library/" + name
		}
		name = "docker.io/" + name
	}
	if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") && !hasDigest {
		name += ":latest"
	}
	if hasDigest {
		return name + "@" + digest
	}
	return name
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// PodLogs returns a finished container's whole log.
func PodLogs(ctx context.Context, cs kubernetes.Interface, ns, pod string) (string, error) {
	rc, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		return "", fmt.Errorf("cannot read the logs of pod %s/%s: %w", ns, pod, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return "", fmt.Errorf("cannot read the logs of pod %s/%s: %w", ns, pod, err)
	}
	return string(b), nil
}

// WaitPodDone waits (on a watch) until the pod has succeeded or failed and returns it.
func WaitPodDone(ctx context.Context, cs kubernetes.Interface, ns, name string) (*corev1.Pod, error) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("cannot list pod %s/%s: %w", ns, name, err)
		}
		if len(list.Items) == 1 && podDone(&list.Items[0]) {
			return &list.Items[0], nil
		}
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, fmt.Errorf("cannot watch pod %s/%s: %w", ns, name, err)
		}
		pod, err := watchDone(ctx, w)
		w.Stop()
		if pod != nil || err != nil {
			return pod, err
		}
		// The watch ended (server timeout): list again and go on watching.
	}
}

func watchDone(ctx context.Context, w watch.Interface) (*corev1.Pod, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the pod did not finish: %w", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil
			}
			if ev.Type == watch.Deleted {
				return nil, errors.New("the pod was deleted before it finished")
			}
			if pod, ok := ev.Object.(*corev1.Pod); ok && podDone(pod) {
				return pod, nil
			}
		}
	}
}

func podDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
