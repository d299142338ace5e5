package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// storageClass is a class of the test cluster with no provisioner: its
// claims bind only to the PersistentVolumes a test makes (staticVolume).
func (c cluster) storageClass(t *testing.T) string {
	t.Helper()
	name := "berth-test-" + strings.ReplaceAll(c.ns, "_", "-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: new(storagev1.VolumeBindingImmediate),
	}
	if _, err := c.cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create storage class: %v", err)
	}
	t.Cleanup(func() {
		_ = c.cs.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// staticVolume is a hostPath PersistentVolume of class for the claim of
// agent's workspace (the node is this machine), its directory the run
// user's; it returns the directory.
func (c cluster) staticVolume(t *testing.T, class, agent string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pv-"+agent)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 1879048200, 1879048200); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s-%s", class, strings.ToLower(agent))
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:              class,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: new(corev1.HostPathDirectory)}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: c.ns, Name: kube.ClaimName(agent)},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create persistent volume: %v", err)
	}
	t.Cleanup(func() {
		_ = c.cs.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return dir
}

// pvcSpec is c.spec of agent with its workspace the agent's claim of class.
func (c cluster) pvcSpec(t *testing.T, img, agent, class, text string) isolation.Spec {
	s := c.spec(t, img, text)
	s.AgentID, s.Request.Agent.ID = agent, agent
	s.Kube.Workspace, s.Kube.StorageClass, s.Kube.WorkspaceSize = isolation.KubeWorkspacePVC, class, 64<<20
	return s
}

// podOf reads a run's pod back from the API server when its handle is
// reported.
func (c cluster) podOf(t *testing.T, s *isolation.Spec) <-chan corev1.Pod {
	got := make(chan corev1.Pod, 1)
	s.OnStart = func(h string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pod, err := c.cs.CoreV1().Pods(c.ns).Get(ctx, h[strings.LastIndexByte(h, '/')+1:], metav1.GetOptions{})
		if err != nil {
			return err
		}
		got <- *pod
		return nil
	}
	return got
}

// What a run of an agent writes to /workspace is there for the agent's
// next run, in a claim of its own that berth created and no sweep deletes,
// and another agent's run does not see it; each pod mounts its agent's
// claim and /tmp, nothing else. Control: with the default emptyDir the
// same two runs do not find the file.
func TestKubernetesWorkspaceClaimPersistsForItsAgentOnly(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	class := c.storageClass(t)
	dirA := c.staticVolume(t, class, "alice")
	c.staticVolume(t, class, "bob")
	const write = "/sh echo note-of-alice > /workspace/x && echo wrote=$?"
	const read = "/sh cat /workspace/x; echo read=$?; ls -a /workspace"

	first := c.pvcSpec(t, img, "alice", class, write)
	pod := c.podOf(t, &first)
	res, err := run(t, c.b, first)
	if err != nil || !strings.Contains(res.Response.Reply, "wrote=0") {
		t.Fatalf("first run: %v\n%s\n%s", err, res.Response.Reply, res.Stderr)
	}
	mountsOnly(t, <-pod, "alice")
	if data, err := os.ReadFile(filepath.Join(dirA, "x")); err != nil || string(data) != "note-of-alice\n" {
		t.Fatalf("alice's volume holds %q (%v), want the file the run wrote", data, err)
	}

	second := c.pvcSpec(t, img, "alice", class, read)
	res, err = run(t, c.b, second)
	if err != nil || !strings.Contains(res.Response.Reply, "note-of-alice") || !strings.Contains(res.Response.Reply, "read=0") {
		t.Fatalf("the agent's next run does not find its file: %v\n%s\n%s", err, res.Response.Reply, res.Stderr)
	}

	other := c.pvcSpec(t, img, "bob", class, read)
	pod = c.podOf(t, &other)
	res, err = run(t, c.b, other)
	if err != nil || !strings.Contains(res.Response.Reply, "read=1") || strings.Contains(res.Response.Reply, "note-of-alice") {
		t.Fatalf("another agent's run: %v; it sees alice's workspace?\n%s", err, res.Response.Reply)
	}
	mountsOnly(t, <-pod, "bob")

	claim, err := c.cs.CoreV1().PersistentVolumeClaims(c.ns).Get(context.Background(), kube.ClaimName("alice"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("alice's claim: %v", err)
	}
	if claim.Labels[kube.LabelWorkspace] != "1" || claim.Labels[kube.LabelAgent] != "alice" || claim.Labels[kube.LabelInstance] != kube.InstanceLabel(t.Name()) {
		t.Errorf("claim labels %v", claim.Labels)
	}
	if claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != class || claim.Spec.Resources.Requests.Storage().Value() != 64<<20 {
		t.Errorf("claim spec %+v: want class %s and 64Mi", claim.Spec, class)
	}
	if _, err := c.b.Sweep(context.Background(), func(string, int) bool { return false }); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if _, err := c.cs.CoreV1().PersistentVolumeClaims(c.ns).Get(context.Background(), kube.ClaimName("alice"), metav1.GetOptions{}); err != nil {
		t.Fatalf("the sweep deleted the workspace claim: %v", err)
	}

	// Control: the same runs on an emptyDir workspace lose the file.
	lost := c.spec(t, img, write)
	if _, err := run(t, c.b, lost); err != nil {
		t.Fatal(err)
	}
	res, err = run(t, c.b, c.spec(t, img, read))
	if err != nil || !strings.Contains(res.Response.Reply, "read=1") {
		t.Fatalf("control: an emptyDir workspace kept the file (%v):\n%s", err, res.Response.Reply)
	}
}

// mountsOnly checks a pod has the agent's claim at /workspace, a memory
// /tmp, and no other volume or mount.
func mountsOnly(t *testing.T, pod corev1.Pod, agent string) {
	t.Helper()
	data, _ := json.Marshal(pod.Spec.Volumes)
	if len(pod.Spec.Volumes) != 2 {
		t.Fatalf("pod %s has volumes %s, want the workspace claim and /tmp only", pod.Name, data)
	}
	for _, v := range pod.Spec.Volumes {
		switch v.Name {
		case "workspace":
			if v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != kube.ClaimName(agent) || v.PersistentVolumeClaim.ReadOnly {
				t.Errorf("pod %s's workspace volume is %s, want claim %s", pod.Name, data, kube.ClaimName(agent))
			}
		case "tmp":
			if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
				t.Errorf("pod %s's /tmp is %s, want a memory emptyDir", pod.Name, data)
			}
		default:
			t.Errorf("pod %s has volume %s: %s", pod.Name, v.Name, data)
		}
	}
	if ms := pod.Spec.Containers[0].VolumeMounts; len(ms) != 2 || len(pod.Spec.Containers) != 2 || len(pod.Spec.InitContainers) != 0 {
		t.Errorf("pod %s mounts %+v in %d containers, want /workspace and /tmp in the agent's, beside the files container", pod.Name, ms, len(pod.Spec.Containers))
	} else if fm := pod.Spec.Containers[1].VolumeMounts; pod.Spec.Containers[1].Name != "files" || len(fm) != 1 || fm[0].Name != "workspace" {
		t.Errorf("pod %s's second container is %s mounting %+v, want files with the workspace only", pod.Name, pod.Spec.Containers[1].Name, fm)
	}
}

// A claim that never binds (no volume of its class) fails the run with a
// reason naming the claim within the start timeout, not at the run's
// timeout; control: once a volume for it exists, the same agent's run works.
func TestKubernetesWorkspaceClaimThatNeverBindsFailsTheRun(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	if _, err := run(t, c.b, c.spec(t, img, "/sh true")); err != nil {
		t.Fatalf("a first run: %v", err)
	}
	class := c.storageClass(t)
	b, err := kube.New(kube.Options{Config: testkube.Config(t), Instance: t.Name(), Namespace: c.ns, ProxyHost: testkube.BridgeIP, StartTimeout: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := c.pvcSpec(t, img, "carol", class, "/sh echo never")
	s.Kube.EgressVerifiedBy = "admin"
	began := time.Now()
	_, err = run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "workspace claim "+c.ns+"/"+kube.ClaimName("carol")) || !strings.Contains(err.Error(), "not bound") {
		t.Fatalf("run = %v, want %q naming the unbound claim", err, isolation.ReasonStart)
	}
	if took := time.Since(began); took >= s.Timeout {
		t.Errorf("the run took %s, its whole timeout", took)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)

	c.staticVolume(t, class, "carol")
	ok := c.pvcSpec(t, img, "carol", class, "/sh echo bound")
	if res, err := run(t, c.b, ok); err != nil || !strings.Contains(res.Response.Reply, "bound") {
		t.Fatalf("control: a run once the claim can bind: %v\n%s", err, res.Stderr)
	}
}

// A plan with a claim workspace mounts that agent's claim and nothing
// else, makes the volume the run user's group, and hashes apart from an
// emptyDir plan (a warm emptyDir pod must not serve a claim plan); claim
// names are valid and distinct for ids that sanitize alike.
func TestKubernetesPodForMountsTheAgentsClaim(t *testing.T) {
	c := cluster{ns: "berth", proxy: "10.231.0.1:17000"}
	s := c.pvcSpec(t, "berth-agent:x", "alice", "fast", "hi")
	pod, hash, err := kube.PodFor(s.Plan, "i")
	if err != nil {
		t.Fatal(err)
	}
	mountsOnly(t, *pod, "alice")
	if sc := pod.Spec.SecurityContext; sc.FSGroup == nil || *sc.FSGroup != 1879048200 {
		t.Errorf("fsGroup %v, want the run user's group", sc.FSGroup)
	}
	_, emptyHash, _ := kube.PodFor(c.spec(t, "berth-agent:x", "hi").Plan, "i")
	if emptyHash == hash {
		t.Error("a claim plan and an emptyDir plan have one config hash")
	}
	claim := kube.ClaimFor(s.Plan, "i")
	if claim.Name != kube.ClaimName("alice") || *claim.Spec.StorageClassName != "fast" || claim.Spec.Resources.Requests.Storage().Value() != 64<<20 ||
		len(claim.Spec.AccessModes) != 1 || claim.Spec.AccessModes[0] != corev1.ReadWriteOnce || claim.Labels[kube.LabelWorkspace] != "1" {
		t.Errorf("claim %+v", claim)
	}
	names := map[string]bool{}
	for _, id := range []string{"a.b", "a_b", "A-B", "---", strings.Repeat("x", 80)} {
		n := kube.ClaimName(id)
		if names[n] || len(n) > 63 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" || strings.HasSuffix(n, "-") {
			t.Errorf("ClaimName(%q) = %q: taken or not a Kubernetes name", id, n)
		}
		names[n] = true
	}
}
