package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

// Daemon is one daemon the exporter asks for its metrics; Label is its
// daemon label ("intake").
type Daemon struct {
	Label string
	Name  string
	Path  dbus.ObjectPath
}

// Daemons are berth's daemons that serve dev.berth.Metrics1.
var Daemons = []Daemon{
	{Label: "intake", Name: bus.IntakeName, Path: bus.IntakePath},
	{Label: "scheduler", Name: bus.SchedulerName, Path: bus.SchedulerPath},
	{Label: "images", Name: bus.ImagesName, Path: bus.ImagesPath},
}

// DaemonLabel is the label the exporter adds to every series of a daemon.
const DaemonLabel = "daemon"

// DefaultCallTimeout bounds one daemon's answer; Prometheus' default scrape
// timeout is 10 s, and the daemons are asked at once.
const DefaultCallTimeout = 5 * time.Second

// Exporter answers a scrape by asking every running daemon for its metrics
// over D-Bus (without starting one: intake and berth-imaged exit when idle)
// and merging the answers, each series labelled with its daemon. A daemon
// that is not running, or does not answer, has berth_up 0 and no series.
type Exporter struct {
	conn    *dbus.Conn
	daemons []Daemon
	timeout time.Duration
	log     *slog.Logger
	self    *prometheus.Registry
	up      *prometheus.Desc
	took    *prometheus.Desc
}

// NewExporter asks daemons (Daemons when none) on conn.
func NewExporter(conn *dbus.Conn, log *slog.Logger, daemons ...Daemon) *Exporter {
	if len(daemons) == 0 {
		daemons = Daemons
	}
	if log == nil {
		log = slog.Default()
	}
	return &Exporter{
		conn: conn, daemons: daemons, timeout: DefaultCallTimeout, log: log,
		self: NewRegistry(),
		up: prometheus.NewDesc("berth_up", "1 when the daemon was running and answered this scrape, 0 when it is not running (intake and berth-imaged exit when idle) or did not answer.",
			[]string{DaemonLabel}, nil),
		took: prometheus.NewDesc("berth_scrape_duration_seconds", "How long the daemon took to answer this scrape.",
			[]string{DaemonLabel}, nil),
	}
}

// answer is what one daemon said.
type answer struct {
	fams []*dto.MetricFamily
	up   bool
	took time.Duration
}

// Gather implements prometheus.Gatherer.
func (e *Exporter) Gather() ([]*dto.MetricFamily, error) {
	answers := make([]answer, len(e.daemons))
	var wg sync.WaitGroup
	for i, d := range e.daemons {
		wg.Go(func() { answers[i] = e.ask(d) })
	}
	wg.Wait()

	gs := prometheus.Gatherers{}
	var consts []prometheus.Metric
	for i, d := range e.daemons {
		a := answers[i]
		up := 0.0
		if a.up {
			up = 1
			consts = append(consts, prometheus.MustNewConstMetric(e.took, prometheus.GaugeValue, a.took.Seconds(), d.Label))
			gs = append(gs, static(labelled(a.fams, d.Label)))
		}
		consts = append(consts, prometheus.MustNewConstMetric(e.up, prometheus.GaugeValue, up, d.Label))
	}
	own, err := e.self.Gather()
	if err != nil {
		e.log.Warn("cannot gather the exporter's own metrics", "err", err)
	}
	gs = append(gs, static(labelled(own, "metrics")))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(constCollector{descs: []*prometheus.Desc{e.up, e.took}, metrics: consts}); err != nil {
		return nil, fmt.Errorf("cannot register berth_up: %w", err)
	}
	gs = append(gs, reg)
	return gs.Gather()
}

// ask calls one daemon's Metrics, never starting it.
func (e *Exporter) ask(d Daemon) answer {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	began := time.Now()
	b, err := busapi.NewMetrics(e.conn, d.Name, d.Path).Metrics(ctx)
	if err != nil {
		if notRunning(err) {
			return answer{}
		}
		e.log.Warn("a daemon did not answer for its metrics", DaemonLabel, d.Label, "err", err)
		return answer{}
	}
	fams, err := Decode(b)
	if err != nil {
		e.log.Warn("a daemon's metrics could not be read", DaemonLabel, d.Label, "err", err)
		return answer{}
	}
	return answer{fams: fams, up: true, took: time.Since(began)}
}

// notRunning tells "nobody owns the name" from a daemon that failed.
func notRunning(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.DBus.Error.NameHasNoOwner" || de.Name == "org.freedesktop.DBus.Error.ServiceUnknown"
	}
	var dep *dbus.Error
	if errors.As(err, &dep) {
		return dep.Name == "org.freedesktop.DBus.Error.NameHasNoOwner" || dep.Name == "org.freedesktop.DBus.Error.ServiceUnknown"
	}
	return false
}

// labelled adds daemon=label to every metric of fams (in place).
func labelled(fams []*dto.MetricFamily, label string) []*dto.MetricFamily {
	name := DaemonLabel
	for _, f := range fams {
		for _, m := range f.Metric {
			m.Label = slices.DeleteFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == DaemonLabel })
			m.Label = append(m.Label, &dto.LabelPair{Name: &name, Value: &label})
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		}
	}
	return fams
}

// static gathers families already read.
type static []*dto.MetricFamily

func (s static) Gather() ([]*dto.MetricFamily, error) { return s, nil }

// constCollector collects metrics made for one scrape.
type constCollector struct {
	descs   []*prometheus.Desc
	metrics []prometheus.Metric
}

func (c constCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.metrics {
		ch <- m
	}
}

// Handler serves /metrics (text, protobuf or OpenMetrics, as the scraper
// asks) and a pointer to it on /.
func (e *Exporter) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(e, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
		Timeout:           2 * DefaultCallTimeout,
	}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("berth-metrics: Prometheus metrics of berth's daemons are on /metrics\n"))
	})
	return mux
}
