package kube_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation/kube"
)

// A sweep while this scheduler's probe pod runs (a restarted scheduler
// sweeps what the dead one left, as its first run probes) leaves the probe
// alone: the run that waited for it goes on.
func TestKubernetesASweepDuringTheProbeLeavesTheProbeAlone(t *testing.T) {
	c := newCluster(t) // not parallel: the probe hook is the package's
	img := image(t)
	swept := make(chan []string, 1)
	kube.OnProbeCreated(t, func(ns, name string) {
		if ns != c.ns {
			return
		}
		removed, err := c.b.Sweep(context.Background(), func(string, int) bool { return false })
		if err != nil {
			t.Errorf("sweep: %v", err)
		}
		swept <- removed
	})
	res, err := c.b.Run(context.Background(), c.spec(t, img, "/sh echo after-the-probe"))
	if err != nil || !strings.Contains(res.Response.Reply, "after-the-probe") {
		t.Fatalf("run after a sweep during its probe: %v; reply %q", err, res.Response.Reply)
	}
	select {
	case <-swept:
	default:
		t.Fatal("the run did not probe: the test proved nothing")
	}
}
