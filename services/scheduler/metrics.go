package scheduler

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/isolation"
)

// Bounds of the host label of berth_egress_requests_total: allowed hosts
// are mostly the agents' rules, refused ones whatever a sandbox asked for,
// so each has its own cap and refusals cannot crowd allowed hosts out.
const (
	maxAllowedHostLabels = 50
	maxRefusedHostLabels = 20
)

// maxModelLabels bounds the model label of the provider series: a model
// name reaches the scheduler from a run's egress proxy, so it is capped the
// way hosts are.
const maxModelLabels = 30

// callBuckets span one provider call, from a cached answer to a long
// streamed one.
var callBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}

// runBuckets span a run from a warm sandbox's tens of milliseconds to the
// default timeout's ten minutes and beyond.
var runBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}

// knownReasons are the run failure reasons that are their own label value;
// any other reason (an agent's own error text) counts as "agent error".
var knownReasons = []string{
	isolation.ReasonTimeout, isolation.ReasonCanceled, isolation.ReasonConfinement, isolation.ReasonCrashed,
	isolation.ReasonStart, isolation.ReasonBadResponse, isolation.ReasonOutOfMemory, isolation.ReasonUntracked,
	isolation.ReasonEngineUnavailable, isolation.ReasonImageUnavailable,
	isolation.ReasonImageBuildFailed, isolation.ReasonProviderNeedsNetwork, isolation.ReasonAgentNotConfigured,
	isolation.ReasonUndeliverable, isolation.ReasonContainerUnavailable, isolation.ReasonInterruptedTwice,
	isolation.ReasonNoBackend, isolation.ReasonInternal,
}

// schedulerMetrics are berth-scheduler's series. Labels are configured
// agents, backends, run states, fixed reasons and stages, and a capped set
// of hosts: never a run id, message id, channel or user.
type schedulerMetrics struct {
	reg      *prometheus.Registry
	runs     *prometheus.CounterVec
	failures *prometheus.CounterVec
	duration *prometheus.HistogramVec
	stage    *prometheus.HistogramVec
	egress   *prometheus.CounterVec
	bytes    *prometheus.CounterVec

	calls, callErrors, tokens, cost, budgetRefusals *prometheus.CounterVec
	callLatency                                     *prometheus.HistogramVec
	// approvals counts asks by agent and outcome (approvals.go).
	approvals *prometheus.CounterVec

	allowedHosts, refusedHosts, models *metrics.LabelCap
}

func newSchedulerMetrics(s *Service) *schedulerMetrics {
	m := &schedulerMetrics{
		reg: metrics.NewRegistry(),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "scheduler", Name: "runs_total",
			Help: "Runs this scheduler ran to their end, by agent, backend and final state.",
		}, []string{"agent", "backend", "state"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "scheduler", Name: "run_failures_total",
			Help: "Failed runs by agent and reason (an agent's own error counts as \"agent error\").",
		}, []string{"agent", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "scheduler", Name: "run_duration_seconds",
			Help:    "Time from a run's start to its end, by agent and backend.",
			Buckets: runBuckets,
		}, []string{"agent", "backend"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "scheduler", Name: "run_stage_seconds",
			Help:    "Where a run's time goes: queue (queued to started), run (started to ended: sandbox start, confinement and the agent's loop), reply (ended to the reply taken by intake).",
			Buckets: runBuckets,
		}, []string{"agent", "stage"}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "egress", Name: "requests_total",
			Help: "Egress proxy decisions of finished runs by agent, host and verdict; hosts past a bound are \"other\".",
		}, []string{"agent", "host", "verdict"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "egress", Name: "bytes_total",
			Help: "Bytes the egress proxy carried for finished runs, by agent and direction (up: to the outside).",
		}, []string{"agent", "direction"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "calls_total",
			Help: "Provider calls the egress proxy forwarded for finished runs, by agent, provider and model; models past a bound are \"other\".",
		}, []string{"agent", "provider", "model"}),
		callErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "errors_total",
			Help: "Provider calls of finished runs that got no answer or a status over 399, by agent, provider and model.",
		}, []string{"agent", "provider", "model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "tokens_total",
			Help: "Tokens the provider calls of finished runs used, by agent, provider, model and kind: input (cached ones included), output, cached.",
		}, []string{"agent", "provider", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "cost_total",
			Help: "What the provider calls of finished runs cost at [providers.X.prices], in the admin's currency, by agent, provider and model.",
		}, []string{"agent", "provider", "model"}),
		budgetRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "calls_refused_total",
			Help: "Provider calls of finished runs the egress proxy refused for a budget, by agent and budget.",
		}, []string{"agent", "budget"}),
		callLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "provider", Name: "call_duration_seconds",
			Help:    "Time one provider call took at the egress proxy, its answer relayed whole, by agent, provider and model.",
			Buckets: callBuckets,
		}, []string{"agent", "provider", "model"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "scheduler", Name: "approvals_total",
			Help: "Approvals by agent and outcome: asked (a person was asked), remembered (a conversation's earlier allow answered), allowed, denied, expired (approval_timeout passed), ended (the run ended first).",
		}, []string{"agent", "outcome"}),
		allowedHosts: metrics.NewLabelCap(maxAllowedHostLabels),
		refusedHosts: metrics.NewLabelCap(maxRefusedHostLabels),
		models:       metrics.NewLabelCap(maxModelLabels),
	}
	m.reg.MustRegister(m.runs, m.failures, m.duration, m.stage, m.egress, m.bytes,
		m.calls, m.callErrors, m.tokens, m.cost, m.budgetRefusals, m.callLatency, m.approvals,
		schedulerState{s: s,
			running:          prometheus.NewDesc("berth_scheduler_runs_running", "Runs running now.", nil, nil),
			queued:           prometheus.NewDesc("berth_scheduler_queue_depth", "Runs queued.", nil, nil),
			quarantined:      prometheus.NewDesc("berth_scheduler_runs_quarantined", "Undecodable runs set aside (berthctl status).", nil, nil),
			sandboxes:        prometheus.NewDesc("berth_scheduler_sandboxes_alive", "Conversation sandboxes alive, by agent.", []string{"agent"}, nil),
			poolWaiting:      prometheus.NewDesc("berth_scheduler_warm_pool_waiting", "Warm sandboxes waiting for a run, by agent and backend.", []string{"agent", "backend"}, nil),
			poolSize:         prometheus.NewDesc("berth_scheduler_warm_pool_size", "Warm sandboxes the pool keeps (the agent's warm setting), by agent and backend.", []string{"agent", "backend"}, nil),
			poolHits:         prometheus.NewDesc("berth_scheduler_warm_pool_hits_total", "Runs that took a waiting warm sandbox, by agent and backend.", []string{"agent", "backend"}, nil),
			poolMisses:       prometheus.NewDesc("berth_scheduler_warm_pool_misses_total", "Runs that asked the warm pool and found no sandbox waiting, so started their own, by agent and backend.", []string{"agent", "backend"}, nil),
			approvalsPending: prometheus.NewDesc("berth_scheduler_approvals_pending", "Requests and tool calls waiting for a person's decision now.", nil, nil),
		},
		metrics.NewBolt(DBName, s.store.db, s.store.w))
	return m
}

// Metrics is the registry dev.berth.Metrics1 serves.
func (s *Service) Metrics() prometheus.Gatherer { return s.metrics.reg }

// countEnded records a run this process ran to its end (execute), with
// what its egress proxy decided.
func (s *Service) countEnded(final Run, res isolation.Result) {
	if !Finished(final.State) {
		return
	}
	m := s.metrics
	m.runs.WithLabelValues(final.Agent, final.Backend, final.State).Inc()
	if final.State == StateFailed {
		reason := final.Reason
		if !slices.Contains(knownReasons, reason) {
			reason = "agent error"
		}
		m.failures.WithLabelValues(final.Agent, reason).Inc()
	}
	if !final.StartedAt.IsZero() {
		if !final.CreatedAt.IsZero() {
			m.stage.WithLabelValues(final.Agent, "queue").Observe(max(final.StartedAt.Sub(final.CreatedAt), 0).Seconds())
		}
		if !final.FinishedAt.IsZero() {
			d := max(final.FinishedAt.Sub(final.StartedAt), 0).Seconds()
			m.stage.WithLabelValues(final.Agent, "run").Observe(d)
			m.duration.WithLabelValues(final.Agent, final.Backend).Observe(d)
			for stage, took := range runStages(final, res.Response.Spans) {
				m.stage.WithLabelValues(final.Agent, stage).Observe(took.Seconds())
			}
		}
	}
	m.countUsage(final.Agent, res.Usage)
	c := res.EgressCounts
	for _, h := range append(slices.Clone(c.Hosts), c.OtherHosts) {
		host := strings.ToLower(h.Host)
		if host == "" {
			host = metrics.Other
		}
		if h.Allowed > 0 {
			m.egress.WithLabelValues(final.Agent, m.allowedHosts.Value(host), "allowed").Add(float64(h.Allowed))
		}
		if h.Refused > 0 {
			m.egress.WithLabelValues(final.Agent, m.refusedHosts.Value(host), "refused").Add(float64(h.Refused))
		}
	}
	up, down := c.BytesUp, c.BytesDown
	if up > 0 {
		m.bytes.WithLabelValues(final.Agent, "up").Add(float64(up))
	}
	if down > 0 {
		m.bytes.WithLabelValues(final.Agent, "down").Add(float64(down))
	}
}

// Stages inside a run: start (started to the sandbox ready: its handle
// recorded, before the agent reads its request), confine (sandbox ready to
// the agent's loop starting: berth-agent confines itself first) and
// agent_loop (berth-agent's loop span, its model and tool calls).
const (
	stageStart     = "start"
	stageConfine   = "confine"
	stageAgentLoop = "agent_loop"
)

// runStages are the stages inside run r that its record and its agent's
// span records tell. The span times come from the sandbox: a stage is
// measured only when its times fall inside the run, as berth saw it.
func runStages(r Run, spans []agentproto.SpanRecord) map[string]time.Duration {
	out := map[string]time.Duration{}
	inRun := func(t time.Time) bool { return !t.Before(r.StartedAt) && !t.After(r.FinishedAt) }
	ready := r.ReadyAt
	if !ready.IsZero() && inRun(ready) {
		out[stageStart] = ready.Sub(r.StartedAt)
	} else {
		ready = time.Time{}
	}
	i := slices.IndexFunc(spans, func(s agentproto.SpanRecord) bool {
		return s.Name == agentproto.SpanLoop && s.Parent < 0
	})
	if i < 0 {
		return out
	}
	loop := spans[i]
	if !inRun(loop.Start) || !inRun(loop.End) || loop.End.Before(loop.Start) {
		return out
	}
	out[stageAgentLoop] = loop.End.Sub(loop.Start)
	if !ready.IsZero() && !loop.Start.Before(ready) {
		out[stageConfine] = loop.Start.Sub(ready)
	}
	return out
}

// countUsage records what a finished run's provider calls spent, from its
// usage record (the proxy's own count), per model as far as the record
// keeps models and the rest as provider and model "other".
func (m *schedulerMetrics) countUsage(agent string, u egresspolicy.Usage) {
	if u.Refused > 0 {
		budget := u.Budget
		if !slices.Contains(budgetNames, budget) {
			budget = metrics.Other
		}
		m.budgetRefusals.WithLabelValues(agent, budget).Add(float64(u.Refused))
	}
	rest := egresspolicy.ModelUsage{Provider: metrics.Other, Model: metrics.Other,
		Calls: u.Calls, Errors: u.Errors, Tokens: u.Tokens, Cost: u.Cost}
	for _, mu := range u.Models {
		m.countModel(agent, mu.Provider, mu.Model, mu)
		rest.Calls -= mu.Calls
		rest.Errors -= mu.Errors
		rest.Input, rest.Output, rest.Cached = rest.Input-mu.Input, rest.Output-mu.Output, rest.Cached-mu.Cached
		rest.Cost -= mu.Cost
	}
	if rest.Calls > 0 {
		m.countModel(agent, metrics.Other, metrics.Other, rest)
	}
}

// budgetNames are the budgets a refusal may name.
var budgetNames = []string{egresspolicy.BudgetTokensPerDay, egresspolicy.BudgetCostPerDay,
	egresspolicy.BudgetCostPerRun, egresspolicy.BudgetRequestsPerMinute}

func (m *schedulerMetrics) countModel(agent, provider, model string, u egresspolicy.ModelUsage) {
	provider, model = m.providerLabels(provider, model)
	if u.Calls > 0 {
		m.calls.WithLabelValues(agent, provider, model).Add(float64(u.Calls))
	}
	if u.Errors > 0 {
		m.callErrors.WithLabelValues(agent, provider, model).Add(float64(u.Errors))
	}
	for kind, n := range map[string]int64{"input": u.Input, "output": u.Output, "cached": u.Cached} {
		if n > 0 {
			m.tokens.WithLabelValues(agent, provider, model, kind).Add(float64(n))
		}
	}
	if u.Cost > 0 {
		m.cost.WithLabelValues(agent, provider, model).Add(u.Cost)
	}
}

// providerLabels are a call's provider and model as labels: provider is a
// config id, model is capped.
func (m *schedulerMetrics) providerLabels(provider, model string) (string, string) {
	provider = strings.ToValidUTF8(provider, "")
	if provider == "" || len(provider) > metrics.MaxLabelLen {
		provider = metrics.Other
	}
	model = strings.ToValidUTF8(model, "")
	if model == "" {
		model = metrics.Other
	}
	return provider, m.models.Value(model)
}

// observeCall records one provider call's latency as its proxy reports it
// (the run's usage record keeps no latency).
func (m *schedulerMetrics) observeCall(agent string, c egresspolicy.Call) {
	if c.Budget != "" {
		return // refused: never sent
	}
	provider, model := m.providerLabels(c.Provider, c.Model)
	m.callLatency.WithLabelValues(agent, provider, model).Observe(max(time.Duration(c.Latency)*time.Millisecond, 0).Seconds())
}

// countDelivered records how long a finished run's reply waited for intake.
func (s *Service) countDelivered(r Run) {
	if r.FinishedAt.IsZero() || r.Connector == "" {
		return
	}
	s.metrics.stage.WithLabelValues(r.Agent, "reply").Observe(max(s.clock.Now().Sub(r.FinishedAt), 0).Seconds())
}

// schedulerState collects what the scheduler holds at the moment of the
// scrape: running runs and sandboxes (under the mutexes that guard only
// those maps) and the queue's depth (one read transaction, as the D-Bus
// properties do).
type schedulerState struct {
	s                                       *Service
	running, queued, quarantined, sandboxes *prometheus.Desc

	poolWaiting, poolSize, poolHits, poolMisses *prometheus.Desc
	approvalsPending                            *prometheus.Desc
}

func (c schedulerState) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.queued
	ch <- c.quarantined
	ch <- c.sandboxes
	ch <- c.poolWaiting
	ch <- c.poolSize
	ch <- c.poolHits
	ch <- c.poolMisses
	ch <- c.approvalsPending
}

func (c schedulerState) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	running := len(s.active)
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(running))
	s.approvals.mu.Lock()
	pending := len(s.approvals.live)
	s.approvals.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.approvalsPending, prometheus.GaugeValue, float64(pending))
	var queued, quarantined int
	if err := s.store.db.View(func(tx *bolt.Tx) error {
		queued = queueBucket(tx).Stats().KeyN
		quarantined = quarantineCount(tx)
		return nil
	}); err == nil {
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(queued))
		ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue, float64(quarantined))
	}
	perAgent := map[string]int{}
	s.sandboxes.mu.Lock()
	for conv, sb := range s.sandboxes.byConv {
		if sb.kept != nil {
			perAgent[conv.agent]++
		}
	}
	s.sandboxes.mu.Unlock()
	for agent, n := range perAgent {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(n), agent)
	}
	// Warm pools: the backends that keep them say what they hold (each
	// under its own pool mutex, which no engine call holds).
	for name, b := range s.opts.Backends {
		pr, ok := b.(isolation.PoolReporter)
		if !ok {
			continue
		}
		for _, st := range pr.PoolStats() {
			ch <- prometheus.MustNewConstMetric(c.poolWaiting, prometheus.GaugeValue, float64(st.Waiting), st.Agent, name)
			ch <- prometheus.MustNewConstMetric(c.poolSize, prometheus.GaugeValue, float64(st.Size), st.Agent, name)
			ch <- prometheus.MustNewConstMetric(c.poolHits, prometheus.CounterValue, float64(st.Hits), st.Agent, name)
			ch <- prometheus.MustNewConstMetric(c.poolMisses, prometheus.CounterValue, float64(st.Misses), st.Agent, name)
		}
	}
}
