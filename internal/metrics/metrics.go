// Package metrics is what berth's daemons share to be measured: each
// daemon's Prometheus registry, its dev.berth.Metrics1 object on the bus
// (the registry as delimited protobuf), the bound on label values that come
// from outside (hosts, models), bbolt's collector, and the exporter
// berth-metrics serves, which asks every running daemon over D-Bus and
// merges the answers (ADR 23, docs/admin/metrics.md).
//
// No daemon listens for metrics itself: intake's webhook listener is public
// and serves none, and a daemon that is not running (intake and berth-imaged
// exit when idle) is not started to be asked.
package metrics

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/units"
)

// Interface is the D-Bus interface every daemon serves its metrics on, at
// its own object path.
const Interface = busapi.MetricsInterface

// Namespace starts every berth series name.
const Namespace = "berth"

// Other is the label value that stands for every value past a LabelCap.
const Other = "other"

// Format is the exposition Metrics() returns on the bus.
var Format = expfmt.NewFormat(expfmt.TypeProtoDelim)

// NewRegistry is a daemon's registry: its own collectors are added by the
// daemon; the Go runtime's and the process's are there already.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Encode gathers g into the bus exposition.
func Encode(g prometheus.Gatherer) ([]byte, error) {
	fams, err := g.Gather()
	if err != nil && len(fams) == 0 {
		return nil, fmt.Errorf("cannot gather metrics: %w", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, Format)
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return nil, fmt.Errorf("cannot encode metric family %s: %w", f.GetName(), err)
		}
	}
	return buf.Bytes(), nil
}

// Decode reads the bus exposition back into metric families.
func Decode(b []byte) ([]*dto.MetricFamily, error) {
	dec := expfmt.NewDecoder(bytes.NewReader(b), Format)
	var out []*dto.MetricFamily
	for {
		f := &dto.MetricFamily{}
		err := dec.Decode(f)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("cannot decode metrics: %w", err)
		}
		out = append(out, f)
	}
}

// object is dev.berth.Metrics1 on a daemon's object path.
type object struct {
	g prometheus.Gatherer
}

// Metrics implements dev.berth.Metrics1.Metrics. Who may call it is the bus
// policy's to say (root, berth-metrics, berth-admin).
func (o object) Metrics() ([]byte, *dbus.Error) {
	b, err := Encode(o.g)
	if err != nil {
		return nil, bus.NewError(bus.ErrInternal, "%v", err)
	}
	return b, nil
}

// Export serves g as dev.berth.Metrics1 at path on conn. The daemon lists
// IntrospectData in its own introspection of path.
func Export(conn *dbus.Conn, path dbus.ObjectPath, g prometheus.Gatherer) error {
	if err := conn.Export(object{g: g}, path, Interface); err != nil {
		return fmt.Errorf("cannot export %s at %s: %w", Interface, path, err)
	}
	return nil
}

var introspectOnce = sync.OnceValues(func() (introspect.Interface, error) {
	var node introspect.Node
	if err := xml.Unmarshal([]byte(units.MetricsXML), &node); err != nil {
		return introspect.Interface{}, fmt.Errorf("cannot parse %s XML: %w", Interface, err)
	}
	for _, i := range node.Interfaces {
		if i.Name == Interface {
			return i, nil
		}
	}
	return introspect.Interface{}, fmt.Errorf("units/dbus/%s.xml declares no %s", Interface, Interface)
})

// IntrospectData is dev.berth.Metrics1 as units/dbus/dev.berth.Metrics1.xml
// declares it, for a daemon's introspection node.
func IntrospectData() introspect.Interface {
	i, err := introspectOnce()
	if err != nil {
		panic(err) // the embedded file is the repository's: a test catches it
	}
	return i
}

// LabelCap bounds the values one label takes that come from outside berth's
// config (hosts a sandbox asked for, models a provider named): the first N
// distinct values seen keep their own series, every later one is Other.
// Counters stay monotonic (a value never moves between series), and the
// set of series is bounded for the life of the process.
type LabelCap struct {
	mu   sync.Mutex
	max  int
	kept map[string]struct{}
}

// MaxLabelLen bounds one label value; a longer one is Other too.
const MaxLabelLen = 253

// NewLabelCap keeps at most n values.
func NewLabelCap(n int) *LabelCap {
	return &LabelCap{max: n, kept: make(map[string]struct{}, n)}
}

// Value is v when v is kept (or there is room to keep it), else Other.
func (c *LabelCap) Value(v string) string {
	if v == "" || v == Other {
		return v
	}
	if len(v) > MaxLabelLen {
		return Other
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.kept[v]; ok {
		return v
	}
	if len(c.kept) >= c.max {
		return Other
	}
	c.kept[v] = struct{}{}
	return v
}

// Len is how many values are kept.
func (c *LabelCap) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.kept)
}
