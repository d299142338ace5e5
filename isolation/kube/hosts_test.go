package kube_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/berth-dev/berth/internal/testkit/testkube"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// hostBackend is a scheduler's backend on a berth host: every host here
// has the same state directory path, as two hosts installed alike do.
func hostBackend(t *testing.T, ns, host string) *kube.Backend {
	t.Helper()
	b, err := kube.New(kube.Options{Config: testkube.Config(t), Instance: "/var/lib/berth", HostID: host, Namespace: ns, ProxyHost: testkube.BridgeIP})
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

// running starts s on b and returns its pod's handle once the pod has its
// request; the run ends when the test does.
func running(t *testing.T, b *kube.Backend, s isolation.Spec) string {
	t.Helper()
	handles := make(chan string, 1)
	s.OnStart = func(h string) error { handles <- h; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { _, err := b.Run(ctx, s); ended <- err }()
	t.Cleanup(func() { cancel(); <-ended })
	select {
	case h := <-handles:
		return h
	case err := <-ended:
		t.Fatalf("run %s ended before its pod started: %v", s.RunID, err)
	case <-time.After(3 * time.Minute):
		t.Fatalf("run %s: no pod within 3 minutes", s.RunID)
	}
	return ""
}

// Two berth hosts share a namespace (and the same state directory path):
// a restarted scheduler's sweep on one removes its own dead run's pod and
// leaves the other host's pod running, and its Kill refuses the other
// host's handle. The control: a backend configured with the other's host
// id sweeps that pod, so the host label is what keeps it.
func TestKubernetesHostsSweepOnlyTheirOwnPods(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	a := hostBackend(t, c.ns, "host-a")
	b := hostBackend(t, c.ns, "host-b")
	if a.Identity() == b.Identity() {
		t.Fatalf("two hosts share the identity %q", a.Identity())
	}
	sa := c.spec(t, img, "/sh sleep 300")
	sa.AgentID, sa.Kube.EgressVerifiedBy = "agent-a", "admin"
	sb := c.spec(t, img, "/sh sleep 300")
	sb.AgentID, sb.Kube.EgressVerifiedBy = "agent-b", "admin"
	running(t, a, sa)
	hb := running(t, b, sb)
	podA := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+sa.RunID)
	podB := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+sb.RunID)
	if len(podA) != 1 || len(podB) != 1 || podA[0].Labels[kube.LabelHost] != "host-a" || podB[0].Labels[kube.LabelHost] != "host-b" {
		t.Fatalf("pods %+v / %+v: want one per host, labelled with it", podA, podB)
	}

	restartedA := hostBackend(t, c.ns, "host-a")
	removed, err := restartedA.Sweep(context.Background(), func(string, int) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != sa.RunID {
		t.Fatalf("host a's sweep removed %v (%v), want only its run %s", removed, err, sa.RunID)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+sa.RunID)
	if left := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+sb.RunID); len(left) != 1 {
		t.Fatalf("host a's sweep removed host b's pod")
	}
	if err := restartedA.Kill(context.Background(), hb); err == nil || !strings.Contains(err.Error(), "another berth host") {
		t.Fatalf("host a's Kill of host b's pod = %v, want it refused", err)
	}
	if left := podsOf(t, c.cs, c.ns, kube.LabelRun+"="+sb.RunID); len(left) != 1 {
		t.Fatalf("host a's Kill removed host b's pod")
	}

	// Control: the same sweep with host b's identity does remove it.
	asB := hostBackend(t, c.ns, "host-b")
	if removed, err := asB.Sweep(context.Background(), func(string, int) bool { return false }); err != nil || len(removed) != 1 || removed[0] != sb.RunID {
		t.Fatalf("control: a sweep as host b removed %v (%v), want run %s", removed, err, sb.RunID)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+sb.RunID)
}

// An agent configured on two hosts is served by the one holding its
// lease: the other refuses its runs with a reason naming the holder, runs
// no pod, and serves it once the holder released the lease (its scheduler
// stopped) — the control that the refusal is the lease's.
func TestKubernetesAgentLeaseLetsOneHostServeIt(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	a := hostBackend(t, c.ns, "host-a")
	b := hostBackend(t, c.ns, "host-b")
	spec := func(text string) isolation.Spec {
		s := c.spec(t, img, text)
		s.AgentID, s.Kube.EgressVerifiedBy = "shared", "admin"
		return s
	}
	if res, err := run(t, a, spec("/sh echo from-a")); err != nil || !strings.Contains(res.Response.Reply, "from-a") {
		t.Fatalf("host a's run: %v %q", err, res.Response.Reply)
	}
	if holder, err := a.LeaseHolder(context.Background(), c.ns, "shared"); err != nil || holder != a.Identity() {
		t.Fatalf("lease holder %q (%v), want host a %q", holder, err, a.Identity())
	}
	refused := spec("/sh echo from-b")
	_, err := run(t, b, refused)
	if !errors.Is(err, kube.ErrLeaseHeld) || isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), a.Identity()) {
		t.Fatalf("host b's run = %v, want it refused naming the holder %s", err, a.Identity())
	}
	if n := len(podsOf(t, c.cs, c.ns, kube.LabelRun+"="+refused.RunID)); n != 0 {
		t.Fatalf("the refused run made %d pods", n)
	}
	if ex := strings.Join(b.Explain(refused.Plan).Holds, "\n"); !strings.Contains(ex, "held by "+a.Identity()) {
		t.Errorf("host b's explain does not name the holder:\n%s", ex)
	}
	lease, err := c.cs.CoordinationV1().Leases(c.ns).Get(context.Background(), kube.LeaseName("shared"), metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != a.Identity() || lease.Labels[kube.LabelLease] != "shared" {
		t.Fatalf("the Lease object %+v (%v): want it held by host a", lease, err)
	}

	// Control: host a's scheduler stops and releases it; host b serves.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Drain(ctx); err != nil {
		t.Fatalf("host a's drain: %v", err)
	}
	if res, err := run(t, b, spec("/sh echo from-b")); err != nil || !strings.Contains(res.Response.Reply, "from-b") {
		t.Fatalf("host b's run after host a released the lease: %v %q", err, res.Response.Reply)
	}
	if holder, _ := b.LeaseHolder(context.Background(), c.ns, "shared"); holder != b.Identity() {
		t.Fatalf("lease holder %q, want host b", holder)
	}
	if _, err := run(t, a, spec("/sh echo from-a")); !errors.Is(err, kube.ErrLeaseHeld) {
		t.Fatalf("host a's run after host b took the lease = %v, want refused", err)
	}
}

// The host identity is host_id when set, else /etc/machine-id; neither is
// an error, not an empty identity two hosts would share.
func TestKubernetesHostIDDefaultsToTheMachineID(t *testing.T) {
	dir := t.TempDir()
	old := kube.MachineIDFile
	t.Cleanup(func() { kube.MachineIDFile = old })
	kube.MachineIDFile = filepath.Join(dir, "machine-id")
	if id, err := kube.HostID("rack-7"); err != nil || id != "rack-7" {
		t.Fatalf("HostID(rack-7) = %q, %v", id, err)
	}
	if _, err := kube.HostID(""); err == nil || !strings.Contains(err.Error(), "host_id") {
		t.Fatalf("HostID with no machine-id = %v, want an error naming host_id", err)
	}
	if err := os.WriteFile(kube.MachineIDFile, []byte("3d1219c7c4c5404aaa1f6d2a48adfda4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, err := kube.HostID(""); err != nil || id != "3d1219c7c4c5404aaa1f6d2a48adfda4" {
		t.Fatalf("HostID from machine-id = %q, %v", id, err)
	}
	if _, err := kube.HostID("no spaces"); err == nil {
		t.Fatal("HostID accepted a value that is no label value")
	}
	if _, err := kube.New(kube.Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, HostID: "bad/host"}); err == nil {
		t.Fatal("New accepted a host id that is no label value")
	}
}
