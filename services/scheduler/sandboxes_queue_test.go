package scheduler

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// A conversation whose sandbox is busy holds up none of its agent's other
// conversations: its next message waits in its place, and a message of
// another thread, queued after it, runs in a sandbox of its own meanwhile.
// The waiting message runs once its sandbox is free, in its own sandbox.
func TestABusyConversationHoldsUpNoneOfItsAgentsOtherConversations(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	start(t, s)

	first := succeeded(t, s, say(t, s, "A", "/sh pwd"))
	workspace := shellOut(first.Reply)
	busyA := say(t, s, "A", "/sh while [ ! -e go-a ]; do sleep 0.05; done; echo a")
	waitRunning(t, s, busyA)
	nextA := say(t, s, "A", "/sh echo a-again")
	b := succeeded(t, s, say(t, s, "B", "/sh echo b"))
	if b.Sandbox == "" || b.Sandbox == first.Sandbox {
		t.Fatalf("B ran in sandbox %q; want one of its own (A's is %s)", b.Sandbox, first.Sandbox)
	}
	if r, err := s.GetRun(nextA); err != nil || r.State != StateQueued {
		t.Fatalf("A's next message while A is busy: %+v %v; want queued", r.State, err)
	}
	if err := os.WriteFile(filepath.Join(workspace, "go-a"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	succeeded(t, s, busyA)
	if r := succeeded(t, s, nextA); r.Sandbox != first.Sandbox {
		t.Fatalf("A's next message ran in sandbox %q, want A's %s", r.Sandbox, first.Sandbox)
	}
}
