package intake

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/services/intake/connector"
)

// A connector's status change (a reply the platform refused) reaches the
// bus as PropertiesChanged at once, not on the deliver loop's next pass:
// the loops run on a fake clock here, so they never pass again.
func TestAConnectorsStatusChangeIsPublishedWithoutWaitingForTheDeliverLoop(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	clock := clockwork.NewFakeClockAt(time.Now())
	s, _ := startPlatforms(t, platformConfig(), f, WithClock(clock), WithSubmitter(newRecordingSubmitter()))
	b := exportOnPrivateBus(t, s)
	listener := b.Conn(t)
	if err := listener.AddMatchSignal(dbus.WithMatchObjectPath(bus.IntakePath), dbus.WithMatchInterface(propertiesInterface),
		dbus.WithMatchMember("PropertiesChanged")); err != nil {
		t.Fatal(err)
	}
	signals := make(chan *dbus.Signal, 64)
	listener.Signal(signals)

	passes := passHook(s)
	runService(t, s)
	passes.waitFor(t, "deliver")
	alpha := f.get("alpha")
	waitRunning(t, alpha)
	waitUntilPublished(t, s)

	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	alpha.SetStatus(connector.Status{Type: "fake", State: connector.StateConnected, LastError: "the platform refused the reply", LastErrorAt: at})
	timeout := time.After(30 * time.Second)
	for {
		select {
		case sig := <-signals:
			if len(sig.Body) < 2 {
				continue
			}
			changed, _ := sig.Body[1].(map[string]dbus.Variant)
			list, _ := changed["Connectors"].Value().([]map[string]dbus.Variant)
			for _, c := range list {
				if c["id"].Value() == "alpha" && c["last_error"].Value() == "the platform refused the reply" {
					if got := c["last_error_at"].Value(); got != "2026-12-02T04:00:00Z" {
						t.Fatalf("last_error_at = %v, want 2026-12-02T04:00:00Z", got)
					}
					return
				}
			}
		case <-timeout:
			t.Fatal("the connector's new last error was not published on the bus")
		}
	}
}

// publishWatch is the bus's property setter, counting publications so a
// test knows when the publisher is idle.
type publishWatch struct {
	propertySetter
	busy, done atomic.Int32
}

func (w *publishWatch) setCounts(inbox, outbox uint32) {
	w.busy.Add(1)
	w.propertySetter.setCounts(inbox, outbox)
}

func (w *publishWatch) setConnectors(st []ConnectorStatus) {
	w.propertySetter.setConnectors(st)
	w.busy.Add(-1)
	w.done.Add(1)
}

// waitUntilPublished returns once the publisher has sent what it was asked
// to send so far and waits for the next request: a change made after it is
// published only if something asks for it.
func waitUntilPublished(t *testing.T, s *Service) {
	t.Helper()
	w := &publishWatch{}
	s.propsMu.Lock()
	w.propertySetter = s.props
	s.props = w
	s.propsMu.Unlock()
	// One publication through w: the publisher is past any it had begun.
	s.refreshConnectors()
	eventually(t, "the publisher sent the properties", func() bool { return w.done.Load() > 0 })
	eventually(t, "the publisher is idle", func() bool { return len(s.wakePublish) == 0 && w.busy.Load() == 0 })
}
