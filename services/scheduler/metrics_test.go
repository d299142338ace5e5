package scheduler

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// schedulerMetricsOnBus asks the scheduler for its metrics as berth-metrics
// does, until cond holds of them (the series of a run are counted once its
// outcome is committed, just after GetRun can see it).
func schedulerMetricsOnBus(t *testing.T, conn *dbus.Conn, what string, cond func([]*dto.MetricFamily) bool) ([]*dto.MetricFamily, []byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, err := busapi.NewMetrics(conn, bus.SchedulerName, bus.SchedulerPath).Metrics(context.Background())
		if err != nil {
			t.Fatalf("Metrics over the bus: %v", err)
		}
		fams, err := metrics.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if cond(fams) {
			return fams, raw
		}
		if time.Now().After(deadline) {
			var names []string
			for _, f := range fams {
				if strings.HasPrefix(f.GetName(), "berth_") {
					names = append(names, f.String())
				}
			}
			t.Fatalf("timed out waiting until %s; the berth series are:\n%s", what, strings.Join(names, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A real run through the landlock backend and a real berth-egress: its
// provider call is counted by agent, host and verdict, with its bytes, and
// the run by agent, backend and state, with its stages.
func TestSchedulerMetricsOverTheBusCountARunAndItsEgress(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	d := newDeliveries(0)
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv: func(k string) string {
			if k == "OPENAI_API_KEY" {
				return egressTestKey
			}
			return ""
		},
		Deliverer: d,
		Logger:    quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	id := submit(t, s, "msg-4711", "alpha", "text", directTraffic(model.Listener.Addr().String()), "connector", "hooks", "channel", "chan-0815")
	start(t, s)
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded {
		t.Fatalf("run = %s %q %q", r.State, r.Reason, r.Error)
	}

	conn := b.Conn(t)
	fams, raw := schedulerMetricsOnBus(t, conn, "the run and its reply are counted", func(fams []*dto.MetricFamily) bool {
		n, _ := metrics.Sample(fams, "berth_scheduler_run_stage_seconds", "agent", "alpha", "stage", "reply")
		return n == 1
	})
	host := "127.0.0.1"
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"berth_scheduler_runs_total", []string{"agent", "alpha", "backend", landlock.Name, "state", StateSucceeded}, 1},
		{"berth_scheduler_run_duration_seconds", []string{"agent", "alpha", "backend", landlock.Name}, 1},
		{"berth_scheduler_run_stage_seconds", []string{"agent", "alpha", "stage", "queue"}, 1},
		{"berth_scheduler_run_stage_seconds", []string{"agent", "alpha", "stage", "run"}, 1},
		{"berth_egress_requests_total", []string{"agent", "alpha", "host", host, "verdict", "allowed"}, 1},
		{"berth_scheduler_runs_running", nil, 0},
		{"berth_scheduler_queue_depth", nil, 0},
		{"berth_scheduler_runs_quarantined", nil, 0},
	} {
		got, ok := metrics.Sample(fams, want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	for _, dir := range []string{"up", "down"} {
		if v, _ := metrics.Sample(fams, "berth_egress_bytes_total", "agent", "alpha", "direction", dir); v <= 0 {
			t.Errorf("berth_egress_bytes_total{direction=%s} = %v, want the provider call's bytes", dir, v)
		}
	}
	if v, _ := metrics.Sample(fams, "berth_bolt_commits_total", "db", DBName); v < 2 {
		t.Errorf("berth_bolt_commits_total{db=scheduler.db} = %v, want the submit, claim and outcome", v)
	}
	for _, never := range []string{id, "msg-4711", "chan-0815", egressTestKey} {
		if strings.Contains(string(raw), never) {
			t.Errorf("the scheduler's metrics hold %q", never)
		}
	}
}

// Hosts a sandbox asks for are bounded: past the caps every further host
// is "other", and refusals cannot take the places of allowed hosts.
func TestEgressHostLabelsAreBoundedAndRefusalsKeepTheirOwnBound(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(1), t.TempDir(), newGateBackend("landlock"), nil)
	var c isolation.EgressCounts
	for i := range 500 {
		c.Hosts = append(c.Hosts, isolation.EgressHostCount{Host: "h" + strconv.Itoa(i) + ".attacker.example", Refused: 1})
	}
	c.Hosts = append(c.Hosts, isolation.EgressHostCount{Host: "api.openai.com", Allowed: 3})
	now := time.Now()
	s.countEnded(Run{Agent: "alpha", Backend: "landlock", State: StateSucceeded, CreatedAt: now, StartedAt: now, FinishedAt: now}, isolation.Result{EgressCounts: c})
	fams, err := s.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	hosts := metrics.LabelValues(fams, "berth_egress_requests_total", "host")
	if len(hosts) != maxRefusedHostLabels+1+1 {
		t.Errorf("%d host series, want %d refused hosts, %q and the allowed one", len(hosts), maxRefusedHostLabels, metrics.Other)
	}
	if v, _ := metrics.Sample(fams, "berth_egress_requests_total", "host", "api.openai.com", "verdict", "allowed"); v != 3 {
		t.Errorf("the allowed host counted %v, want 3 (refusals must not crowd it out)", v)
	}
	if v, _ := metrics.Sample(fams, "berth_egress_requests_total", "host", metrics.Other, "verdict", "refused"); v != 500-maxRefusedHostLabels {
		t.Errorf("%s counted %v refusals, want %d", metrics.Other, v, 500-maxRefusedHostLabels)
	}
}
