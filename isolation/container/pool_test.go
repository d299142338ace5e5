package container_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/isolation"
	boxes "github.com/berth-dev/berth/isolation/container"
)

// warmContainers lists the running warm containers of agent "tester" made
// by the test's instance.
func warmContainers(t *testing.T, cli *client.Client) []container.Summary {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).
		Add("label", boxes.LabelPool+"=tester").
		Add("label", boxes.LabelInstance+"="+boxes.InstanceLabel(instance(t)))})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitWarm waits until want(the warm containers) holds.
func waitWarm(t *testing.T, cli *client.Client, what string, want func([]container.Summary) bool) []container.Summary {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cs := warmContainers(t, cli)
		running := slices.DeleteFunc(slices.Clone(cs), func(c container.Summary) bool { return c.State != "running" })
		if len(running) == len(cs) && want(running) {
			return running
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2 minutes; warm containers: %+v", what, cs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func count(n int) func([]container.Summary) bool {
	return func(cs []container.Summary) bool { return len(cs) == n }
}

func ids(cs []container.Summary) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func drainOnCleanup(t *testing.T, b *boxes.Backend) {
	t.Cleanup(func() {
		if err := b.Drain(context.Background()); err != nil {
			t.Errorf("drain: %v", err)
		}
	})
}

func TestWarmRunTakesAContainerStartedBeforeItAndAReplacementStarts(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	drainOnCleanup(t, b)
	ws := workspace(t)
	warm := box{Warm: 1}
	b.Warm(nil) // no warm agent: nothing starts
	time.Sleep(time.Second)
	if cs := warmContainers(t, cli); len(cs) != 0 {
		t.Fatalf("warm containers without a warm agent: %v", ids(cs))
	}
	template := spec(t, ws, "", warm)
	b.Warm([]isolation.Spec{template})
	before := waitWarm(t, cli, "one warm container", count(1))[0]
	if _, ok := before.Labels[boxes.LabelRun]; ok || before.Labels[boxes.LabelConfigHash] == "" {
		t.Fatalf("warm container labels %v: want berth.pool and a config hash, no berth.run", before.Labels)
	}

	const secret = "sk-berth-warm-SECRET"
	s := spec(t, ws, "/sh hostname", warm)
	s.Request.Provider.Key = secret
	var handle string
	s.OnStart = func(h string) error { handle = h; return nil }
	reply := mustRun(t, b, s)
	if handle != "container:"+before.ID || !strings.Contains(reply, before.ID[:12]) {
		t.Fatalf("run used %s (hostname in reply %q); want the container started before it, %s", handle, reply, before.ID[:12])
	}
	if exists(t, cli, before.ID) {
		t.Fatal("the warm container outlived its run")
	}
	after := waitWarm(t, cli, "a replacement", count(1))[0]
	if after.ID == before.ID {
		t.Fatal("the replacement is the container that served the run")
	}
}

func TestWarmContainerNeverServesTwoRuns(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	drainOnCleanup(t, b)
	ws := workspace(t)
	warm := box{Warm: 2}
	b.Warm([]isolation.Spec{spec(t, ws, "", warm)})
	waitWarm(t, cli, "two warm containers", count(2))
	seen := map[string]bool{}
	for i := range 4 {
		reply := mustRun(t, b, spec(t, ws, "/sh echo host=$(hostname); ls /tmp | wc -l; touch /tmp/used", warm))
		host := strings.Fields(reply[strings.LastIndex(reply, "host=")+len("host="):])[0]
		if seen[host] {
			t.Fatalf("run %d ran in container %s again", i, host)
		}
		seen[host] = true
		if !strings.Contains(reply, "\n0\n") {
			t.Fatalf("run %d found files in /tmp: %q", i, reply)
		}
	}
}

func TestWarmContainersOfAnOldConfigAreReplaced(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	drainOnCleanup(t, b)
	ws := workspace(t)
	b.Warm([]isolation.Spec{spec(t, ws, "", box{Warm: 1, MemoryLimit: "128m"})})
	old := waitWarm(t, cli, "a warm container", count(1))[0]

	changed := box{Warm: 1, MemoryLimit: "256m"}
	b.Warm([]isolation.Spec{spec(t, ws, "", changed)})
	fresh := waitWarm(t, cli, "the old container replaced", func(cs []container.Summary) bool {
		return len(cs) == 1 && cs[0].ID != old.ID
	})[0]
	if fresh.Labels[boxes.LabelConfigHash] == old.Labels[boxes.LabelConfigHash] {
		t.Fatalf("replacement has the old config hash %s", old.Labels[boxes.LabelConfigHash])
	}
	if exists(t, cli, old.ID) {
		t.Fatal("the container of the old config is still there")
	}
	inspected, err := cli.ContainerInspect(context.Background(), fresh.ID, client.ContainerInspectOptions{})
	if err != nil || inspected.Container.HostConfig.Memory != 256<<20 {
		t.Fatalf("replacement memory limit: %v, %v; want 256m", inspected.Container.HostConfig, err)
	}

	// A run whose config changed without Warm (a reload the backend has not
	// heard of) runs cold and replaces the pool too.
	s := spec(t, ws, "/sh hostname", box{Warm: 1, MemoryLimit: "192m"})
	if reply := mustRun(t, b, s); strings.Contains(reply, fresh.ID[:12]) {
		t.Fatalf("a run of another config took a stale warm container: %q", reply)
	}
	waitWarm(t, cli, "the pool moved to the run's config", func(cs []container.Summary) bool {
		return len(cs) == 1 && cs[0].ID != fresh.ID
	})
}

func TestDrainRemovesEveryWaitingContainer(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	b.Warm([]isolation.Spec{spec(t, workspace(t), "", box{Warm: 3})})
	waitWarm(t, cli, "three warm containers", count(3))
	if err := b.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cs := warmContainers(t, cli); len(cs) != 0 {
		t.Fatalf("containers left after drain: %v", ids(cs))
	}
	// After a drain a run does not start a pool by itself.
	mustRun(t, b, spec(t, workspace(t), "/sh true", box{Warm: 3}))
	time.Sleep(time.Second)
	if cs := warmContainers(t, cli); len(cs) != 0 {
		t.Fatalf("a run after drain started warm containers: %v", ids(cs))
	}
}

func TestSweepRemovesWarmContainersOfAnEarlierProcessOnly(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	crashed := newBackend(t, cli) // a scheduler that dies: its pool is not drained
	drainOnCleanup(t, crashed)
	crashed.Warm([]isolation.Spec{spec(t, workspace(t), "", box{Warm: 1})})
	member := waitWarm(t, cli, "a warm container", count(1))[0]

	if _, err := crashed.Sweep(context.Background(), nil); err != nil || !exists(t, cli, member.ID) {
		t.Fatalf("a backend swept its own warm container (err %v)", err)
	}
	restarted := newBackend(t, cli)
	removed, err := restarted.Sweep(context.Background(), nil)
	if err != nil || len(removed) != 0 {
		t.Fatalf("sweep: runs %v, %v; want no runs reported for warm containers", removed, err)
	}
	if exists(t, cli, member.ID) {
		t.Fatal("the sweep left the earlier process's warm container")
	}
}

func exists(t *testing.T, cli *client.Client, id string) bool {
	t.Helper()
	_, err := cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	return err == nil
}
