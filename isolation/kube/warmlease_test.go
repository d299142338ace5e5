package kube_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// warmPods are the live warm pods of agent made by host.
func (c cluster) warmPods(t *testing.T, agent, host string) int {
	t.Helper()
	return len(podsOf(t, c.cs, c.ns, kube.LabelPool+"="+agent+","+kube.LabelHost+"="+host))
}

// waitWarm waits until host keeps want warm pods of agent.
func (c cluster) waitWarm(t *testing.T, agent, host string, want int, why string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for c.warmPods(t, agent, host) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: host %s keeps %d warm pods of %s, want %d", why, host, c.warmPods(t, agent, host), agent, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stayWarm checks that host keeps want warm pods of agent for a while.
func (c cluster) stayWarm(t *testing.T, agent, host string, want int, why string) {
	t.Helper()
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if n := c.warmPods(t, agent, host); n != want {
			t.Fatalf("%s: host %s keeps %d warm pods of %s, want %d", why, host, n, agent, want)
		}
	}
}

// Warm pods follow the agent's lease between two berth hosts configured
// with the same warm agent: the host that holds the lease keeps them, the
// other keeps none (before, both did); when the holder stops, the other
// host's next run takes the lease and its pool fills; a restarted first
// host then keeps none; and when another host takes the lease from under
// a holder (as after a partition), the holder's warm pods are deleted.
func TestKubernetesWarmPodsFollowTheAgentsLease(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	spec := func(text string) isolation.Spec {
		s := c.spec(t, img, text)
		s.AgentID, s.Kube.EgressVerifiedBy, s.Kube.Warm = "shared", "admin", 1
		return s
	}
	a := hostBackend(t, c.ns, "host-a")
	b := hostBackend(t, c.ns, "host-b")

	a.Warm([]isolation.Spec{spec("")})
	c.waitWarm(t, "shared", "host-a", 1, "the first host to start")
	if holder, err := a.LeaseHolder(context.Background(), c.ns, "shared"); err != nil || holder != a.Identity() {
		t.Fatalf("lease holder %q (%v), want host a (its pool took the free lease)", holder, err)
	}
	b.Warm([]isolation.Spec{spec("")})
	c.stayWarm(t, "shared", "host-b", 0, "the host without the lease")

	// Host a's scheduler stops: its pods and lease go; host b's next run
	// takes the lease and its pool fills.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Drain(ctx); err != nil {
		t.Fatalf("host a's drain: %v", err)
	}
	c.waitWarm(t, "shared", "host-a", 0, "a stopped host")
	c.stayWarm(t, "shared", "host-b", 0, "a host that has not served the agent yet")
	if _, err := run(t, b, spec("/sh echo from-b")); err != nil {
		t.Fatalf("host b's run after host a stopped: %v", err)
	}
	c.waitWarm(t, "shared", "host-b", 1, "the host whose run took the lease")

	// Host a starts again: the lease is host b's, so no warm pods.
	a2 := hostBackend(t, c.ns, "host-a")
	a2.Warm([]isolation.Spec{spec("")})
	c.stayWarm(t, "shared", "host-a", 0, "a restarted host without the lease")

	// Host a takes the lease from under host b (as after b was cut off
	// from the API server for longer than the lease): b's renewal finds
	// it and b's warm pods go; a's next run fills a's pool.
	leases := c.cs.CoordinationV1().Leases(c.ns)
	lease, err := leases.Get(ctx, kube.LeaseName("shared"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder, now := a2.Identity(), metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.AcquireTime = &holder, &now, &now
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitWarm(t, "shared", "host-b", 0, "the host that lost the lease")
	if _, err := run(t, a2, spec("/sh echo from-a")); err != nil {
		t.Fatalf("host a's run once it holds the lease: %v", err)
	}
	c.waitWarm(t, "shared", "host-a", 1, "the host that holds the lease again")
	c.stayWarm(t, "shared", "host-b", 0, "the host that lost the lease")
}
