package scheduler

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

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

	allowedHosts, refusedHosts *metrics.LabelCap
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
		allowedHosts: metrics.NewLabelCap(maxAllowedHostLabels),
		refusedHosts: metrics.NewLabelCap(maxRefusedHostLabels),
	}
	m.reg.MustRegister(m.runs, m.failures, m.duration, m.stage, m.egress, m.bytes,
		schedulerState{s: s,
			running:     prometheus.NewDesc("berth_scheduler_runs_running", "Runs running now.", nil, nil),
			queued:      prometheus.NewDesc("berth_scheduler_queue_depth", "Runs queued.", nil, nil),
			quarantined: prometheus.NewDesc("berth_scheduler_runs_quarantined", "Undecodable runs set aside (berthctl status).", nil, nil),
			sandboxes:   prometheus.NewDesc("berth_scheduler_sandboxes_alive", "Conversation sandboxes alive, by agent.", []string{"agent"}, nil),
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
		}
	}
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
}

func (c schedulerState) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.queued
	ch <- c.quarantined
	ch <- c.sandboxes
}

func (c schedulerState) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	running := len(s.active)
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(running))
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
}
