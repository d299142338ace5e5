package metrics

import (
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/boltstore"
)

// commitBuckets are the commit latencies told apart: an fsync on a quiet
// SSD is well under a millisecond, a busy disk's tens of milliseconds.
var commitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Bolt is one bbolt file's series: its size on disk, the committer's commits
// and the writes they held, and each commit's latency. name is the file's
// name ("intake.db"), its db label.
type Bolt struct {
	name      string
	db        *bolt.DB
	committer *boltstore.Committer
	latency   prometheus.Histogram

	size, freePages, commits, writes *prometheus.Desc
}

// NewBolt measures db and, when committer is not nil, its commits (it sets
// the committer's observer). Register the result with the daemon's registry.
func NewBolt(name string, db *bolt.DB, committer *boltstore.Committer) *Bolt {
	labels := prometheus.Labels{"db": name}
	b := &Bolt{
		name: name, db: db, committer: committer,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "bolt", Name: "commit_duration_seconds",
			Help:        "Time one group commit took, its fsyncs included.",
			ConstLabels: labels, Buckets: commitBuckets,
		}),
		size:      prometheus.NewDesc("berth_bolt_file_size_bytes", "Size of the database file on disk.", nil, labels),
		freePages: prometheus.NewDesc("berth_bolt_free_pages", "Pages of the database file that are free for reuse.", nil, labels),
		commits:   prometheus.NewDesc("berth_bolt_commits_total", "Successful group commits since the daemon started.", nil, labels),
		writes:    prometheus.NewDesc("berth_bolt_writes_total", "Writes held by the successful commits since the daemon started.", nil, labels),
	}
	if committer != nil {
		committer.SetCommitObserver(func(took time.Duration, _ int) { b.latency.Observe(took.Seconds()) })
	}
	return b
}

// Describe implements prometheus.Collector.
func (b *Bolt) Describe(ch chan<- *prometheus.Desc) {
	b.latency.Describe(ch)
	ch <- b.size
	ch <- b.freePages
	if b.committer != nil {
		ch <- b.commits
		ch <- b.writes
	}
}

// Collect implements prometheus.Collector. It stats the file and reads
// bbolt's in-memory counters; it takes no lock of the store.
func (b *Bolt) Collect(ch chan<- prometheus.Metric) {
	b.latency.Collect(ch)
	if fi, err := os.Stat(b.db.Path()); err == nil {
		ch <- prometheus.MustNewConstMetric(b.size, prometheus.GaugeValue, float64(fi.Size()))
	}
	ch <- prometheus.MustNewConstMetric(b.freePages, prometheus.GaugeValue, float64(b.db.Stats().FreePageN))
	if b.committer != nil {
		commits, writes := b.committer.Stats()
		ch <- prometheus.MustNewConstMetric(b.commits, prometheus.CounterValue, float64(commits))
		ch <- prometheus.MustNewConstMetric(b.writes, prometheus.CounterValue, float64(writes))
	}
}
