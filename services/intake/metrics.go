package intake

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Why intake refused a message (berth_intake_messages_refused_total's
// reason label): a fixed set, never the error's text.
const (
	refusedUnknownConnector = "unknown_connector"
	refusedTooLarge         = "too_large"
	refusedUnreadable       = "unreadable"
	refusedMisconfigured    = "misconfigured"
	refusedSignature        = "bad_signature"
	refusedMalformed        = "malformed"
	refusedBadID            = "bad_id"
	refusedNoRoute          = "no_route"
	refusedDiskFull         = "disk_full"
	refusedStore            = "store_failed"
)

// connectorStates are the states berth_intake_connector_state has a series for.
var connectorStates = []string{connector.StateConnecting, connector.StateConnected, connector.StateDisconnected, connector.StateHTTP, connector.StateStopped}

// handoffBuckets span a hand-off on an idle machine (a millisecond) to one
// that waited for a scheduler restart (a minute).
var handoffBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// intakeMetrics are berth-intake's series. Labels are configured connector
// ids ("" for a request naming none that is configured) and fixed reasons:
// never a message id, channel or author.
type intakeMetrics struct {
	reg        *prometheus.Registry
	accepted   *prometheus.CounterVec
	refused    *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	handoffs   *prometheus.CounterVec
	retries    *prometheus.CounterVec
	handoff    *prometheus.HistogramVec
}

func newIntakeMetrics(s *Service) *intakeMetrics {
	m := &intakeMetrics{
		reg: metrics.NewRegistry(),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "messages_accepted_total",
			Help: "Messages stored in the inbox (fsynced) and acknowledged to the platform.",
		}, []string{"connector"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "messages_refused_total",
			Help: "Messages intake did not store, by why.",
		}, []string{"connector", "reason"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "messages_duplicate_total",
			Help: "Redeliveries of messages intake had already stored (acknowledged, stored once).",
		}, []string{"connector"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "handoffs_total",
			Help: "Messages handed to the scheduler: submitted, or refused by it for good.",
		}, []string{"connector", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "handoff_retries_total",
			Help: "Hand-offs the scheduler did not take, to be tried again.",
		}, []string{"connector"}),
		handoff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "intake", Name: "handoff_latency_seconds",
			Help:    "Time from a message's arrival to the scheduler taking it (retries included).",
			Buckets: handoffBuckets,
		}, []string{"connector"}),
	}
	m.reg.MustRegister(m.accepted, m.refused, m.duplicates, m.handoffs, m.retries, m.handoff,
		intakeState{s: s,
			inbox:      prometheus.NewDesc("berth_intake_inbox_pending", "Messages accepted and not yet handed to the scheduler.", nil, nil),
			outbox:     prometheus.NewDesc("berth_intake_outbox_pending", "Replies stored and not yet taken by their platform.", nil, nil),
			state:      prometheus.NewDesc("berth_intake_connector_state", "1 for the state each connector is in, 0 for the others.", []string{"connector", "type", "state"}, nil),
			reconnects: prometheus.NewDesc("berth_intake_connector_reconnects_total", "Connection attempts after the first since intake started, whether or not they succeeded.", []string{"connector", "type"}, nil),
		},
		metrics.NewBolt(DBName, s.store.db, s.store.w))
	return m
}

// connectorLabel is id when it is a configured connector, else "": a
// request's path names any connector it likes.
func (s *Service) connectorLabel(id string) string {
	if _, ok := s.connectorByID(id); ok {
		return id
	}
	return ""
}

func (s *Service) countRefused(connectorID, reason string) {
	s.metrics.refused.WithLabelValues(s.connectorLabel(connectorID), reason).Inc()
}

func (s *Service) countAccepted(connectorID string) {
	s.metrics.accepted.WithLabelValues(s.connectorLabel(connectorID)).Inc()
}

func (s *Service) countDuplicate(connectorID string) {
	s.metrics.duplicates.WithLabelValues(s.connectorLabel(connectorID)).Inc()
}

// countHandoff records a message the scheduler took (submitted) or refused
// for good, and how long it waited since it arrived.
func (s *Service) countHandoff(m inboxEntry, outcome string, now time.Time) {
	c := s.connectorLabel(m.Connector)
	s.metrics.handoffs.WithLabelValues(c, outcome).Inc()
	if !m.ReceivedAt.IsZero() {
		s.metrics.handoff.WithLabelValues(c).Observe(max(now.Sub(m.ReceivedAt), 0).Seconds())
	}
}

func (s *Service) countRetry(m inboxEntry) {
	s.metrics.retries.WithLabelValues(s.connectorLabel(m.Connector)).Inc()
}

// Metrics is the registry dev.berth.Metrics1 serves.
func (s *Service) Metrics() prometheus.Gatherer { return s.metrics.reg }

// intakeState collects what intake knows at the moment of the scrape: the
// pending counts (kept by each commit, no walk) and the connectors' status.
type intakeState struct {
	s                                *Service
	inbox, outbox, state, reconnects *prometheus.Desc
}

func (c intakeState) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inbox
	ch <- c.outbox
	ch <- c.state
	ch <- c.reconnects
}

func (c intakeState) Collect(ch chan<- prometheus.Metric) {
	inbox, outbox := c.s.store.pendingCounts()
	ch <- prometheus.MustNewConstMetric(c.inbox, prometheus.GaugeValue, float64(inbox))
	ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(outbox))
	for _, st := range c.s.ConnectorStatuses() {
		for _, state := range connectorStates {
			v := 0.0
			if st.State == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, st.ID, st.Type, state)
		}
		ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(max(st.Reconnects, 0)), st.ID, st.Type)
	}
}
