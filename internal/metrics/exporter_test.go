package metrics_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

// daemonOnBus serves reg as dev.berth.Metrics1 under name and path, as a
// daemon does.
func daemonOnBus(t *testing.T, b *testbus.Bus, name string, path dbus.ObjectPath, reg prometheus.Gatherer) {
	t.Helper()
	conn := b.Conn(t)
	if err := metrics.Export(conn, path, reg); err != nil {
		t.Fatal(err)
	}
	if reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", name, reply, err)
	}
}

func TestTheExporterMergesTheRunningDaemonsAndStartsNone(t *testing.T) {
	t.Parallel()
	b := testbus.Start(t, testbus.Options{})
	for _, d := range []struct {
		name string
		path dbus.ObjectPath
		n    float64
	}{{bus.IntakeName, bus.IntakePath, 3}, {bus.SchedulerName, bus.SchedulerPath, 5}} {
		reg := metrics.NewRegistry()
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_test_things_total", Help: "things"})
		c.Add(d.n)
		reg.MustRegister(c)
		daemonOnBus(t, b, d.name, d.path, reg)
	}
	// Images is not running: it is not asked to start, and is down.

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: metrics.NewExporter(b.Conn(t), nil).Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, body)
	}
	flat := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		flat = append(flat, f)
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"berth_test_things_total", []string{"daemon", "intake"}, 3},
		{"berth_test_things_total", []string{"daemon", "scheduler"}, 5},
		{"berth_up", []string{"daemon", "intake"}, 1},
		{"berth_up", []string{"daemon", "scheduler"}, 1},
		{"berth_up", []string{"daemon", "images"}, 0},
	} {
		got, ok := metrics.Sample(flat, want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	// Each daemon's Go runtime series are told apart by their daemon label.
	if got := metrics.LabelValues(flat, "go_goroutines", "daemon"); len(got) != 3 {
		t.Errorf("go_goroutines has daemons %v, want intake, scheduler and metrics", got)
	}
	var owner bool
	if err := b.Conn(t).BusObject().Call("org.freedesktop.DBus.NameHasOwner", 0, bus.ImagesName).Store(&owner); err != nil || owner {
		t.Errorf("the scrape started %s (owner %v, %v)", bus.ImagesName, owner, err)
	}
}
