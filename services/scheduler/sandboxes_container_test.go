package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	berthcontainer "github.com/berth-dev/berth/isolation/container"
)

// The core of conversation sandboxes on the container backend: a
// conversation keeps its container (and its /tmp) between messages,
// another conversation cannot see that /tmp, a stopped sandbox leaves no
// container, and a restarted scheduler removes what a dead one left.
func TestContainerConversationSandboxesKeepTheirTmpAndLeaveNothing(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	state := sandboxStateDir(t)
	cfg := sandboxConfig(t, time.Hour, 3)
	enabled := true
	cfg.Agents[0].ContainerMode = config.ContainerSettings{Enabled: &enabled, Network: "none"}
	boxes, err := berthcontainer.New(berthcontainer.Options{Client: cli, Instance: state, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	newService := func() *Service {
		s, err := New(cfg, state, Options{
			Backends: map[string]isolation.Backend{berthcontainer.Name: boxes},
			Getenv:   func(string) string { return "" },
			Logger:   quietLog,
			Clock:    clockwork.NewFakeClock(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	kept := func(id string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", berthcontainer.LabelRun+"="+id)})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}

	s := newService()
	stop := start(t, s)
	a1 := succeeded(t, s, say(t, s, "A", "/sh echo from-a > /tmp/mine; echo ok"))
	a2 := succeeded(t, s, say(t, s, "A", "/sh cat /tmp/mine"))
	b1 := succeeded(t, s, say(t, s, "B", "/sh cat /tmp/mine 2>&1; echo done"))
	if a2.Sandbox != a1.Sandbox || !strings.Contains(a2.Reply, "from-a") || a1.Backend != berthcontainer.Name {
		t.Errorf("the conversation's second message ran in %s on %s (first in %s) and read %q; want its own /tmp", a2.Sandbox, a1.Backend, a1.Sandbox, a2.Reply)
	}
	if b1.Sandbox == a1.Sandbox || strings.Contains(b1.Reply, "from-a") {
		t.Errorf("another conversation ran in %s (A's is %s) and read %q from /tmp; want a sandbox of its own", b1.Sandbox, a1.Sandbox, b1.Reply)
	}
	if n := kept(a1.Sandbox); n != 1 {
		t.Fatalf("A's sandbox has %d containers, want 1", n)
	}
	if err := s.StopSandbox(a1.Sandbox); err != nil {
		t.Fatal(err)
	}
	if n := kept(a1.Sandbox); n != 0 {
		t.Errorf("a stopped sandbox left %d containers", n)
	}

	// The scheduler dies with B's sandbox alive: the next one removes it.
	s.abandonSandboxes.Store(true)
	stop()
	if err := s.store.close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, sb := range s.sandboxes.byConv {
			if sb.prep != nil {
				sb.prep.Finish()
			}
		}
	})
	if n := kept(b1.Sandbox); n != 1 {
		t.Fatalf("B's sandbox has %d containers after its scheduler died, want 1 (still running)", n)
	}
	next := newService()
	t.Cleanup(func() { next.Close() })
	start(t, next)
	succeeded(t, next, say(t, next, "C", "/sh echo after"))
	if n := kept(b1.Sandbox); n != 0 {
		t.Errorf("a dead scheduler's sandbox left %d containers after the restart", n)
	}
}
