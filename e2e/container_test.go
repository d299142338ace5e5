package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	boxes "github.com/berth-dev/berth/isolation/container"
)

func containersLabelled(t testing.TB, cli *client.Client, label string) []container.Summary {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", label)})
	if err != nil {
		t.Fatalf("cannot list containers: %v", err)
	}
	return list.Items
}

func exists(t *testing.T, cli *client.Client, id string) bool {
	t.Helper()
	_, err := cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	return err == nil
}

const containerAgent = `[agents.container_mode]
enabled = true
network = "none"
timeout_seconds = 120`

func TestContainerAgentAnswersFromAFreshContainerThatIsGoneAfterwards(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	s := start(t, []agentSpec{{id: "boxed", extra: containerAgent}})
	id := s.mustPost(t, "boxed", "/sh echo in-a-box as $(id -u) in $(pwd)")
	reply := text(s.sink.wait(t, 3*time.Minute, id)[id])
	if uid, ok := agentUIDAfter(reply, "in-a-box as "); !ok || !strings.Contains(reply, fmt.Sprintf("in-a-box as %d in /workspace", uid)) {
		t.Fatalf("reply %q: want the agent in a container as its own uid (agent_uids)", reply)
	}
	runs := s.listRuns(t, busapi.ListFilter{})
	if len(runs) != 1 || runs[0].Backend != busapi.BackendContainer {
		t.Fatalf("runs %v: want one run on the container backend", runs)
	}
	// The container is removed after the reply went out (off its path):
	// wait for the removal, within a deadline.
	deadline := time.Now().Add(30 * time.Second)
	for left := containersLabelled(t, cli, boxes.LabelRun+"="+runs[0].ID); len(left) != 0; left = containersLabelled(t, cli, boxes.LabelRun+"="+runs[0].ID) {
		if time.Now().After(deadline) {
			t.Fatalf("%d containers of the run left behind 30 s after its reply", len(left))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWarmAgentAnswersFromAContainerStartedBeforeTheMessageAndStopDrainsThePool(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	s := start(t, []agentSpec{{id: "boxed-warm", extra: containerAgent + "\nwarm = 1"}})
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler: %v", err)
	}
	pool := boxes.LabelPool + "=boxed-warm"
	waitOne := func(what string, not string) container.Summary {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if cs := containersLabelled(t, cli, pool); len(cs) == 1 && cs[0].State == "running" && cs[0].ID != not {
				return cs[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 2 minutes", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	warm := waitOne("warm container", "")

	id := s.mustPost(t, "boxed-warm", "/sh echo host=$(hostname)")
	reply := text(s.sink.wait(t, 3*time.Minute, id)[id])
	if !strings.Contains(reply, "host="+warm.ID[:12]) {
		t.Fatalf("reply %q: want it from the container started before the message (%s)", reply, warm.ID[:12])
	}
	replacement := waitOne("replacement", warm.ID)
	if exists(t, cli, warm.ID) {
		t.Fatal("the container that served the message is still there")
	}

	if err := s.KillService(bus.SchedulerName, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if left := containersLabelled(t, cli, boxes.LabelAgent+"=boxed-warm"); len(left) != 0 || exists(t, cli, replacement.ID) {
		t.Fatalf("%d containers of the agent left after the scheduler stopped", len(left))
	}
}
