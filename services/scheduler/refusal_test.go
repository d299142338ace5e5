package scheduler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
)

func TestRetriedSubmitGetsItsRunEvenAfterTheAgentWasRemoved(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(1), "", newGateBackend("landlock"), nil)
	first := submit(t, s, "hooks/m1", "gamma")

	// The admin removes gamma; intake, which never saw the first answer,
	// submits the same message again.
	cfg := testConfig(1)
	cfg.Agents = []config.AgentSettings{{ID: "alpha"}, {ID: "beta"}}
	s.Reload(cfg)
	again, err := s.Submit(map[string]string{"id": "hooks/m1", "agent": "gamma", "text": "hello"})
	if err != nil || again != first {
		t.Fatalf("retried Submit = %q, %v; want the existing run %q", again, err, first)
	}
	if _, err := s.Submit(map[string]string{"id": "hooks/m2", "agent": "gamma"}); err == nil {
		t.Fatal("a new message for a removed agent was accepted")
	}
}

// refusingIntake answers like an intake that no longer has the connector.
type refusingIntake struct {
	mu    sync.Mutex
	calls int
}

func (r *refusingIntake) Deliver(context.Context, map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return bus.NewError(bus.ErrInvalidArgument, "unknown connector %q", "gone")
}

func TestReplyRefusedForGoodByIntakeIsNotRetriedForever(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	d := &refusingIntake{}
	s := newTestService(t, testConfig(1), "", b, d)
	start(t, s)
	id := submit(t, s, "gone/m1", "alpha", "connector", "gone")
	b.next(t).reply("done")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err := s.GetRun(id); err == nil && r.Delivered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a reply intake refused for good stayed pending")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(600 * time.Millisecond) // past the first retry delays (250ms, 500ms)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.calls != 1 {
		t.Fatalf("Deliver called %d times for a reply refused for good, want 1", d.calls)
	}
}
