package intake

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/bus"
)

// busctl is what an admin types; it refuses introspection data that lists a
// method twice ("duplicate method 'Ping'").
func TestBusctlIntrospectShowsEveryInterfaceOfIntake(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("busctl"); err != nil {
		t.Fatalf("busctl is needed: %v", err)
	}
	s, _ := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	out, err := exec.Command("busctl", "--address="+b.Address, "introspect", bus.IntakeName, string(bus.IntakePath)).CombinedOutput()
	if err != nil {
		t.Fatalf("busctl introspect failed: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{
		"dev.berth.Intake1", ".Deliver", ".DeliverFiles", ".InboxPending", ".OutboxPending", ".Connectors",
		"org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Properties",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("busctl introspect does not show %s:\n%s", want, text)
		}
	}
	if n := strings.Count(text, ".Ping "); n != 1 {
		t.Errorf("busctl introspect shows Ping %d times, want once:\n%s", n, text)
	}
	// Anyone may introspect, as the D-Bus policy promises.
	if asNobody := b.BusctlAs(t, "nobody", "introspect", bus.IntakeName, string(bus.IntakePath)); !strings.Contains(asNobody, ".Deliver") {
		t.Errorf("busctl introspect as nobody said:\n%s", asNobody)
	}
}
