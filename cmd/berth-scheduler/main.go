// Command berth-scheduler owns scheduler.db and dev.berth.Scheduler1: it
// queues runs per agent, runs each in its isolation backend and delivers the
// results to intake. It is D-Bus-activated (Type=dbus).
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/landlock"
	"github.com/berth-dev/berth/isolation/unrestricted"
	"github.com/berth-dev/berth/services/scheduler"
)

func main() {
	os.Exit(run())
}

func run() int {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/scheduler or /var/lib/berth/scheduler)")
	unrestrictedFlag := flag.Bool("unrestricted", false, "run landlock agents UNRESTRICTED on the host (no sandbox at all)")
	flag.Parse()
	log := daemon.SetupLogging("berth-scheduler")
	if err := serve(*configFlag, *stateFlag, *unrestrictedFlag); err != nil {
		log.Error("berth-scheduler failed", "err", err)
		return 1
	}
	return 0
}

func serve(configFlag, stateFlag string, allUnrestricted bool) error {
	log := slog.Default()
	configPath := daemon.ConfigPath(configFlag)
	cfg, err := daemon.LoadConfig(configPath, log)
	if err != nil {
		return err
	}
	stateDir, err := daemon.StateDir(stateFlag, "scheduler")
	if err != nil {
		return err
	}
	conn, err := bus.ConnectSystem()
	if err != nil {
		return err
	}
	defer conn.Close()

	if hostrun.SystemdAvailable() {
		log.Info("host runs start as transient systemd units (cgroup limits)")
	} else {
		log.Warn("systemd is not reachable (not PID 1, or not root): host runs are held by rlimits only, see berthctl sandbox explain")
	}
	backends := map[string]isolation.Backend{
		landlock.Name:     landlock.New(),
		unrestricted.Name: unrestricted.New(log),
	}
	// The engine is contacted per run, every call with a deadline: a Docker
	// that is down or hung fails container runs with a reason, and landlock
	// agents keep running.
	if cb, err := container.New(container.Options{Instance: stateDir, Logger: log}); err != nil {
		log.Warn("container isolation is not available", "err", err)
	} else {
		backends[container.Name] = cb
	}
	if allUnrestricted {
		log.Warn("--unrestricted: every landlock agent runs UNRESTRICTED on the host, with no sandbox")
		// The scheduler sees this and compiles their plans as unrestricted.
		backends[landlock.Name] = backends[unrestricted.Name]
	}
	svc, err := scheduler.New(cfg, stateDir, scheduler.Options{
		Backends:  backends,
		Deliverer: scheduler.BusDeliverer{Conn: conn},
		Logger:    log,
	})
	if err != nil {
		return err
	}
	defer svc.Close()
	if err := svc.Export(conn); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- svc.Run(ctx) }()

	why := daemon.Loop(ctx, log, conn.Context().Done(), "scheduling runs", func() error {
		newCfg, err := daemon.LoadConfig(configPath, log)
		if err != nil {
			return err
		}
		svc.Reload(newCfg)
		return nil
	})
	log.Info("stopping; running runs go back to the queue", "why", why)
	daemon.Notify("STOPPING=1")
	cancel()
	if err := <-runDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
