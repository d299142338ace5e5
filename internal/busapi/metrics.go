package busapi

import (
	"context"

	"github.com/godbus/dbus/v5"
)

// MetricsInterface is dev.berth.Metrics1, which each daemon serves on its
// own object beside its main interface.
const MetricsInterface = "dev.berth.Metrics1"

// Metrics is a client of one daemon's dev.berth.Metrics1. It never starts
// the daemon: a daemon that is not running has no metrics to give.
type Metrics struct {
	obj dbus.BusObject
}

// NewMetrics is a client of the metrics of the daemon that owns name, at path.
func NewMetrics(conn *dbus.Conn, name string, path dbus.ObjectPath) Metrics {
	return Metrics{obj: conn.Object(name, path)}
}

// Metrics is the daemon's registry as Prometheus' delimited protobuf
// exposition (internal/metrics decodes it).
func (m Metrics) Metrics(ctx context.Context) ([]byte, error) {
	var b []byte
	err := call(ctx, m.obj, dbus.FlagNoAutoStart, MetricsInterface, "Metrics", nil, &b)
	return b, err
}
