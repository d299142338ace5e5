package scheduler

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
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
	again, err := s.Submit(busapi.Submission{MessageID: "hooks/m1", Agent: "gamma", Text: "hello"})
	if err != nil || again != first {
		t.Fatalf("retried Submit = %q, %v; want the existing run %q", again, err, first)
	}
	if _, err := s.Submit(busapi.Submission{MessageID: "hooks/m2", Agent: "gamma"}); err == nil {
		t.Fatal("a new message for a removed agent was accepted")
	}
}

// refusingIntake answers like an intake that no longer has the connector.
type refusingIntake struct {
	mu    sync.Mutex
	calls int
}

func (r *refusingIntake) Deliver(context.Context, busapi.Reply) error {
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
	r := waitDelivered(t, s, id)
	if r.State != StateFailed || r.Reason != isolation.ReasonUndeliverable || r.Reply != "done" || !strings.Contains(r.Error, "unknown connector") {
		t.Fatalf("run refused by intake = state %q reason %q reply %q error %q; want failed, %q, the reply kept, intake's answer", r.State, r.Reason, r.Reply, r.Error, isolation.ReasonUndeliverable)
	}
	// Nothing is left to retry: the run is out of deliveries/.
	if pending := pendingDeliveries(t, s); len(pending) != 0 {
		t.Fatalf("deliveries still pending after a refusal for good: %v", pending)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.calls != 1 {
		t.Fatalf("Deliver called %d times for a reply refused for good, want 1", d.calls)
	}
}

// waitDelivered waits until run id is marked delivered and returns it.
func waitDelivered(t *testing.T, s *Service, id string) Run {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err := s.GetRun(id); err == nil && r.Delivered {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s was not marked delivered within 10s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pendingDeliveries lists the runs deliveries/ still holds.
func pendingDeliveries(t *testing.T, s *Service) []string {
	t.Helper()
	var ids []string
	err := s.store.db.View(func(tx *bolt.Tx) error {
		var err error
		ids, err = pendingDeliveryIDs(tx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
