// Command berth-metrics is berth's Prometheus exporter: socket-activated by
// berth-metrics.socket (127.0.0.1:9477), it answers each scrape of /metrics
// by asking every running berth daemon for its metrics over D-Bus
// (dev.berth.Metrics1) and merging them, each series labelled with its
// daemon. It starts no daemon and holds no state (ADR 23).
package main

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/metrics"
)

// DefaultListen is where berth-metrics listens when not socket-activated.
const DefaultListen = "127.0.0.1:9477"

func main() {
	listenFlag := flag.String("listen", DefaultListen, "address to listen on when not socket-activated")
	idleFlag := flag.Duration("idle-exit", 0, "exit with status 75 after this long without a scrape (0: never); the socket starts it again")
	flag.Parse()
	log := daemon.SetupLogging("berth-metrics")
	os.Exit(daemon.ExitCode(log, "berth-metrics", run(*listenFlag, *idleFlag, log)))
}

func run(listen string, idle time.Duration, log *slog.Logger) error {
	listeners, err := daemon.ActivationListeners("metrics")
	if err != nil {
		return err
	}
	if len(listeners) == 0 {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		listeners = []net.Listener{l}
	}
	conn, err := bus.ConnectSystem()
	if err != nil {
		return err
	}
	defer conn.Close()
	exp := metrics.NewExporter(conn, log)
	return daemon.New(daemon.Options{
		Name:      "berth-metrics",
		Status:    "serving metrics",
		Run:       func(ctx context.Context) error { <-ctx.Done(); return nil },
		BusLost:   conn.Context().Done(),
		Listeners: listeners,
		Handler:   exp.Handler(),
		IdleAfter: idle,
		Seams:     daemon.Seams{Logger: log},
	}).Serve(context.Background())
}
