package scheduler

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
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
// by provider and model with its tokens, cost and latency; the run by
// agent, backend and state, with its stages.
func TestSchedulerMetricsOverTheBusCountARunAndItsEgress(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	agentBin, proxyBin := egressBinaries(t)
	model := usageModel(t) // 90 prompt and 10 completion tokens an answer
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	pr := cfg.Providers.Entries["openai"]
	pr.Prices = config.PricesOf(map[string]egresspolicy.Price{"gpt-test": {Input: 2, Output: 10}})
	cfg.Providers.Entries["openai"] = pr
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
		{"berth_scheduler_run_stage_seconds", []string{"agent", "alpha", "stage", "start"}, 1},
		{"berth_provider_calls_total", []string{"agent", "alpha", "provider", "openai", "model", "gpt-test"}, 1},
		{"berth_provider_tokens_total", []string{"agent", "alpha", "provider", "openai", "model", "gpt-test", "kind", "input"}, 90},
		{"berth_provider_tokens_total", []string{"agent", "alpha", "provider", "openai", "model", "gpt-test", "kind", "output"}, 10},
		{"berth_provider_call_duration_seconds", []string{"agent", "alpha", "provider", "openai", "model", "gpt-test"}, 1},
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
	if v, _ := metrics.Sample(fams, "berth_provider_cost_total", "agent", "alpha", "provider", "openai", "model", "gpt-test"); v < 0.00028*0.999 || v > 0.00028*1.001 {
		t.Errorf("berth_provider_cost_total = %v, want 90 input tokens at 2 and 10 output at 10 per million", v)
	}
	if _, ok := metrics.Sample(fams, "berth_provider_errors_total", "agent", "alpha"); ok {
		t.Error("berth_provider_errors_total counts an error of a call the provider answered 200")
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

// The stages inside a run come from its record (the sandbox ready) and its
// agent's loop span; times a sandbox reports outside the run as berth saw
// it are not believed.
func TestRunStagesComeFromTheRecordAndTheAgentsLoopSpanWhenTheyFallInsideTheRun(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := Run{StartedAt: at(0), ReadyAt: at(200), FinishedAt: at(1000)}
	loop := func(start, end int) []agentproto.SpanRecord {
		return []agentproto.SpanRecord{
			{Name: agentproto.SpanLLM, Parent: 1, Start: at(start), End: at(end)}, // not the loop
			{Name: agentproto.SpanLoop, Parent: -1, Start: at(start), End: at(end)},
		}
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name  string
		run   Run
		spans []agentproto.SpanRecord
		want  map[string]time.Duration
	}{
		{"A_fresh_sandbox_has_every_stage", run, loop(300, 900),
			map[string]time.Duration{stageStart: ms(200), stageConfine: ms(100), stageAgentLoop: ms(600)}},
		{"A_loop_span_from_before_the_run_is_not_believed", run, loop(-5000, 900),
			map[string]time.Duration{stageStart: ms(200)}},
		{"A_loop_span_ending_after_the_run_is_not_believed", run, loop(300, 99000),
			map[string]time.Duration{stageStart: ms(200)}},
		{"A_conversation_sandbox_run_has_only_its_loop", Run{StartedAt: at(0), FinishedAt: at(1000)}, loop(300, 900),
			map[string]time.Duration{stageAgentLoop: ms(600)}},
		{"A_ready_time_of_an_earlier_attempt_is_no_start", Run{StartedAt: at(0), ReadyAt: at(-3000), FinishedAt: at(1000)}, nil,
			map[string]time.Duration{}},
		{"A_loop_that_began_before_its_sandbox_was_ready_has_no_confine_stage", run, loop(100, 900),
			map[string]time.Duration{stageStart: ms(200), stageAgentLoop: ms(800)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := runStages(tc.run, tc.spans)
			if !maps.Equal(got, tc.want) {
				t.Errorf("runStages = %v, want %v", got, tc.want)
			}
		})
	}
}

// Models reach the scheduler from a run's proxy: past the cap every
// further model is "other", and no call, token or cost is lost on the way
// (the record's own cap on models included).
func TestProviderSeriesAreBoundedByModelAndAddUpToTheRunsUsage(t *testing.T) {
	t.Parallel()
	s := newTestService(t, testConfig(1), t.TempDir(), newGateBackend("landlock"), nil)
	var errors int
	for run := range 3 { // each run calls models of its own
		var u egresspolicy.Usage
		for i := range 200 {
			c := egresspolicy.Call{Provider: "openai", Model: "r" + strconv.Itoa(run) + "-m" + strconv.Itoa(i), Status: 200,
				Tokens: egresspolicy.Tokens{Input: 10, Output: 1, Cached: 2}, Cost: 0.5, Priced: true}
			if i%7 == 0 {
				c.Status = 500
			}
			u.Add(c) // the record keeps 16 models, the rest only in its totals
		}
		u.Add(egresspolicy.Call{Provider: "openai", Model: "m0", Budget: egresspolicy.BudgetCostPerDay, BudgetReason: "spent"})
		errors += u.Errors
		now := time.Now()
		s.countEnded(Run{Agent: "alpha", Backend: "landlock", State: StateSucceeded, CreatedAt: now, StartedAt: now, FinishedAt: now}, isolation.Result{Usage: u})
	}
	fams, err := s.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	models := metrics.LabelValues(fams, "berth_provider_calls_total", "model")
	slices.Sort(models)
	if models = slices.Compact(models); len(models) > maxModelLabels+1 {
		t.Errorf("%d model series, want at most %d and %q", len(models), maxModelLabels, metrics.Other)
	}
	sum := func(name string, pairs ...string) float64 {
		var n float64
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				if !hasPairs(m, pairs) {
					continue
				}
				n += m.GetCounter().GetValue()
			}
		}
		return n
	}
	for _, c := range []struct {
		name  string
		pairs []string
		want  float64
	}{
		{"berth_provider_calls_total", nil, 3 * 200},
		{"berth_provider_errors_total", nil, float64(errors)},
		{"berth_provider_tokens_total", []string{"kind", "input"}, 3 * 200 * 10},
		{"berth_provider_tokens_total", []string{"kind", "output"}, 3 * 200},
		{"berth_provider_tokens_total", []string{"kind", "cached"}, 3 * 200 * 2},
		{"berth_provider_cost_total", nil, 3 * 200 * 0.5},
		{"berth_provider_calls_refused_total", []string{"budget", egresspolicy.BudgetCostPerDay}, 3},
	} {
		if got := sum(c.name, c.pairs...); got < c.want-1e-6 || got > c.want+1e-6 {
			t.Errorf("%s%v adds up to %v, want %v", c.name, c.pairs, got, c.want)
		}
	}
}

func hasPairs(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// A backend with warm pools (container, kubernetes) is asked what they
// hold at each scrape; one without (landlock) adds no series.
func TestWarmPoolSeriesAreReadFromTheBackendsThatKeepPools(t *testing.T) {
	t.Parallel()
	pools := &poolingBackend{gateBackend: newGateBackend("container")}
	pools.takes.Count("alpha", false)
	pools.takes.Count("alpha", true)
	pools.takes.Count("alpha", true)
	pools.sizes = map[string][2]int{"alpha": {1, 2}, "beta": {0, 1}}
	s := newTestService(t, testConfig(1), t.TempDir(), newGateBackend("landlock"), nil, func(o *Options) {
		o.Backends["container"] = pools
	})
	fams, err := s.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"berth_scheduler_warm_pool_waiting", []string{"agent", "alpha", "backend", "container"}, 1},
		{"berth_scheduler_warm_pool_size", []string{"agent", "alpha", "backend", "container"}, 2},
		{"berth_scheduler_warm_pool_hits_total", []string{"agent", "alpha", "backend", "container"}, 2},
		{"berth_scheduler_warm_pool_misses_total", []string{"agent", "alpha", "backend", "container"}, 1},
		{"berth_scheduler_warm_pool_size", []string{"agent", "beta", "backend", "container"}, 1},
		{"berth_scheduler_warm_pool_misses_total", []string{"agent", "beta", "backend", "container"}, 0},
	} {
		got, ok := metrics.Sample(fams, want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if backends := metrics.LabelValues(fams, "berth_scheduler_warm_pool_size", "backend"); slices.Contains(backends, "landlock") {
		t.Errorf("warm pool series of backends %v, want container's only", backends)
	}
}

// poolingBackend is a test backend that keeps warm pools.
type poolingBackend struct {
	*gateBackend
	takes isolation.PoolTakes
	sizes map[string][2]int
}

func (b *poolingBackend) PoolStats() []isolation.PoolStat { return b.takes.Stats(b.sizes) }
