package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation/kube"
)

// The memory berthctl sandboxes and Cockpit show for a conversation pod is
// the pod's own: 64 MiB a tool writes to the pod's /tmp (a memory emptyDir)
// shows in it, and it falls back when the tool removes them (control: the
// number follows the pod, it is not a constant or the node's). This works on
// a cluster whose API server refuses the kubelet's stats through its node
// proxy (the test cluster's kubelet is at a loopback address: "address not
// allowed"). A pod that is gone is "unknown", and the error says why each
// way of reading it failed.
func TestKubernetesConversationPodMemoryIsThePodsOwn(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	s := c.keptSpec(t, img)
	k := startKept(t, c.b, s)
	memory := func() int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // as ListSandboxes asks
		defer cancel()
		mem, err := k.Memory(ctx)
		if err != nil {
			t.Fatalf("Memory: %v", err)
		}
		return mem
	}
	idle := memory()
	keptShell(t, k, "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; echo filled")
	filled := memory()
	keptShell(t, k, "rm /tmp/fill; echo emptied")
	emptied := memory()
	t.Logf("working set: idle %d MiB, with 64 MiB in /tmp %d MiB, after rm %d MiB", idle>>20, filled>>20, emptied>>20)
	if idle <= 0 || idle > 128<<20 {
		t.Errorf("an idle conversation pod uses %d bytes; want a few MiB (berth-agent's)", idle)
	}
	if filled < idle+60<<20 || filled > 256<<20 {
		t.Errorf("with 64 MiB in /tmp the pod uses %d bytes (idle %d); want at least 60 MiB more, within its 256 MiB limit", filled, idle)
	}
	if emptied > filled-48<<20 {
		t.Errorf("control: after rm the pod still uses %d bytes (filled %d)", emptied, filled)
	}

	// Gone under the sandbox: unknown, with each way's reason.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.cs.CoreV1().Pods(c.ns).Delete(ctx, podName(k.Handle()), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		mctx, mcancel := context.WithTimeout(context.Background(), 5*time.Second)
		mem, err := k.Memory(mctx)
		mcancel()
		if err != nil {
			for _, want := range []string{"is unknown", "pods/exec", "cannot read the pod", podName(k.Handle())} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error of a gone pod's memory lacks %q: %v", want, err)
				}
			}
			t.Logf("a gone pod's memory: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Memory of a deleted pod = %d, want an error", mem)
		}
	}
}
