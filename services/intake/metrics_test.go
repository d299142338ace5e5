package intake

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
)

// intakeMetricsOnBus asks intake for its metrics as berth-metrics does.
func intakeMetricsOnBus(t *testing.T, conn *dbus.Conn) []*dto.MetricFamily {
	t.Helper()
	b, err := busapi.NewMetrics(conn, bus.IntakeName, bus.IntakePath).Metrics(context.Background())
	if err != nil {
		t.Fatalf("Metrics over the bus: %v", err)
	}
	fams, err := metrics.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func TestIntakeMetricsOverTheBusCountWhatHappenedToEachMessage(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	sched := &fakeScheduler{calls: map[string]int{}, runs: map[string]string{}}
	schedConn := b.Conn(t)
	if err := schedConn.Export(sched, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := schedConn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.SchedulerName, reply, err)
	}
	runService(t, s)

	good := []byte(`{"id":"msg-4711","channel":"ops","author":"author-ada-77","text":"hi"}`)
	for _, c := range []struct {
		r    *http.Request
		want int
	}{
		{signedRequest("hooks", good, testSecret, time.Now()), http.StatusAccepted},
		{signedRequest("hooks", good, testSecret, time.Now()), http.StatusAccepted}, // a redelivery
		{signedRequest("hooks", good, "not-the-secret", time.Now()), http.StatusUnauthorized},
		{signedRequest("strict", []byte(`{"id":"m2","channel":"elsewhere","author":"ada","text":"hi"}`), testSecret, time.Now()), http.StatusUnprocessableEntity},
		{signedRequest("hooks", []byte(`{"id":`), testSecret, time.Now()), http.StatusBadRequest},
		{signedRequest("attacker-chosen-name", good, testSecret, time.Now()), http.StatusNotFound},
	} {
		if status, out := post(t, s, c.r); status != c.want {
			t.Fatalf("POST %s = %d %v, want %d", c.r.URL.Path, status, out, c.want)
		}
	}
	eventually(t, "the message is handed to the scheduler", func() bool {
		pending, _ := s.store.pendingMessages()
		return len(pending) == 0
	})

	conn := b.Conn(t)
	var fams []*dto.MetricFamily
	eventually(t, "the hand-off is counted", func() bool {
		fams = intakeMetricsOnBus(t, conn)
		v, _ := metrics.Sample(fams, "berth_intake_handoffs_total", "connector", "hooks", "outcome", "submitted")
		return v == 1
	})
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"berth_intake_messages_accepted_total", []string{"connector", "hooks"}, 1},
		{"berth_intake_messages_duplicate_total", []string{"connector", "hooks"}, 1},
		{"berth_intake_messages_refused_total", []string{"connector", "hooks", "reason", refusedSignature}, 1},
		{"berth_intake_messages_refused_total", []string{"connector", "hooks", "reason", refusedMalformed}, 1},
		{"berth_intake_messages_refused_total", []string{"connector", "strict", "reason", refusedNoRoute}, 1},
		{"berth_intake_messages_refused_total", []string{"connector", "", "reason", refusedUnknownConnector}, 1},
		{"berth_intake_handoff_latency_seconds", []string{"connector", "hooks"}, 1}, // one observation
		{"berth_intake_inbox_pending", nil, 0},
		{"berth_intake_outbox_pending", nil, 0},
		{"berth_intake_connector_state", []string{"connector", "hooks", "type", "webhook", "state", "http"}, 1},
		{"berth_intake_connector_state", []string{"connector", "hooks", "type", "webhook", "state", "connected"}, 0},
		{"berth_intake_connector_reconnects_total", []string{"connector", "hooks"}, 0},
	} {
		got, ok := metrics.Sample(fams, want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if v, ok := metrics.Sample(fams, "berth_bolt_commits_total", "db", DBName); !ok || v < 2 {
		t.Errorf("berth_bolt_commits_total{db=intake.db} = %v (found %v), want the accept and the hand-off at least", v, ok)
	}
	if v, _ := metrics.Sample(fams, "berth_bolt_commit_duration_seconds", "db", DBName); v < 2 {
		t.Errorf("commit latency has %v observations, want one per commit", v)
	}
	if v, _ := metrics.Sample(fams, "berth_bolt_file_size_bytes", "db", DBName); v <= 0 {
		t.Errorf("berth_bolt_file_size_bytes = %v, want the file's size", v)
	}

	// Nothing from the request's outside world becomes a series: not the
	// message id, not a connector name nobody configured, not the secret.
	raw, err := busapi.NewMetrics(conn, bus.IntakeName, bus.IntakePath).Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, never := range []string{"msg-4711", "attacker-chosen-name", testSecret, "author-ada-77"} {
		if strings.Contains(string(raw), never) {
			t.Errorf("intake's metrics hold %q", never)
		}
	}
}

func TestIntakeMetricsAreForRootAndTheExporterOnly(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	b := exportOnPrivateBus(t, s)
	out := b.BusctlAs(t, "nobody", "call", bus.IntakeName, string(bus.IntakePath), metrics.Interface, "Metrics")
	if !strings.Contains(out, "Access denied") && !strings.Contains(out, "AccessDenied") {
		t.Errorf("busctl call Metrics as nobody said %q, want access denied", out)
	}
	// Introspection lists the interface, as busctl shows it to an admin.
	if text := b.BusctlAs(t, "nobody", "introspect", bus.IntakeName, string(bus.IntakePath)); !strings.Contains(text, metrics.Interface) || !strings.Contains(text, ".Metrics") {
		t.Errorf("busctl introspect does not show %s:\n%s", metrics.Interface, text)
	}
}
