package images

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth/internal/metrics"
)

// buildBuckets span a cached rebuild (a second) to a slow base image
// (half an hour).
var buildBuckets = []float64{1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800}

// imagesMetrics are berth-imaged's series; target is "default" or a
// configured agent.
type imagesMetrics struct {
	reg      *prometheus.Registry
	builds   *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newImagesMetrics(s *Service) *imagesMetrics {
	m := &imagesMetrics{
		reg: metrics.NewRegistry(),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Subsystem: "images", Name: "builds_total",
			Help: "Image builds since berth-imaged started, by target (default or an agent) and outcome.",
		}, []string{"target", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Subsystem: "images", Name: "build_duration_seconds",
			Help:    "Time one image build took, by target.",
			Buckets: buildBuckets,
		}, []string{"target"}),
	}
	m.reg.MustRegister(m.builds, m.duration,
		imagesState{s: s,
			building: prometheus.NewDesc("berth_images_building", "Image builds under way.", nil, nil),
			images:   prometheus.NewDesc("berth_images_images", "Images images.db records.", nil, nil),
		},
		metrics.NewBolt("images.db", s.store.db, nil))
	return m
}

// Metrics is the registry dev.berth.Metrics1 serves.
func (s *Service) Metrics() prometheus.Gatherer { return s.metrics.reg }

// countBuild records one build's end.
func (s *Service) countBuild(target string, err error, took time.Duration) {
	outcome := "succeeded"
	switch {
	case err == nil:
	case canceled(err):
		outcome = "canceled"
	default:
		outcome = "failed"
	}
	s.metrics.builds.WithLabelValues(target, outcome).Inc()
	s.metrics.duration.WithLabelValues(target).Observe(max(took, 0).Seconds())
}

type imagesState struct {
	s                *Service
	building, images *prometheus.Desc
}

func (c imagesState) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.building
	ch <- c.images
}

func (c imagesState) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.building, prometheus.GaugeValue, float64(c.s.Building()))
	if n, err := c.s.store.countImages(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.images, prometheus.GaugeValue, float64(n))
	}
}
