// Command berth-intake accepts chat messages over HTTP (socket-activated by
// berth-intake.socket, or --listen), stores them in intake.db, hands them to
// the scheduler over D-Bus and delivers replies (dev.berth.Intake1.Deliver).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/services/intake"
)

func main() {
	os.Exit(run())
}

func run() int {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/intake or /var/lib/berth/intake)")
	listenFlag := flag.String("listen", "", "HTTP address when not socket-activated (default [intake] listen)")
	flag.Parse()
	log := daemon.SetupLogging("berth-intake")
	if err := serve(*configFlag, *stateFlag, *listenFlag); err != nil {
		log.Error("berth-intake failed", "err", err)
		return 1
	}
	return 0
}

func serve(configFlag, stateFlag, listenFlag string) error {
	log := slog.Default()
	configPath := daemon.ConfigPath(configFlag)
	cfg, err := daemon.LoadConfig(configPath, log)
	if err != nil {
		return err
	}
	stateDir, err := daemon.StateDir(stateFlag, "intake")
	if err != nil {
		return err
	}
	svc, err := intake.New(cfg, stateDir, intake.WithLogger(log))
	if err != nil {
		return err
	}
	defer svc.Close()

	conn, err := bus.ConnectSystem()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := svc.Export(conn); err != nil {
		return err
	}

	listeners, err := daemon.ActivationListeners("http")
	if err != nil {
		return err
	}
	if len(listeners) == 0 {
		addr := listenFlag
		if addr == "" {
			addr = cfg.Intake.Listen
		}
		if addr != "" {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("cannot listen on %s: %w", addr, err)
			}
			listeners = append(listeners, l)
		}
	}
	srv := &http.Server{
		Handler:           svc.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	for _, l := range listeners {
		log.Info("accepting webhooks", "addr", l.Addr().String())
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP listener failed", "addr", l.Addr().String(), "err", err)
			}
		}()
	}
	if len(listeners) == 0 {
		log.Info("no HTTP listener (not socket-activated, no --listen, no [intake] listen): serving D-Bus deliveries only")
	}

	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- svc.Run(ctx) }()

	why := daemon.Loop(ctx, log, conn.Context().Done(), "accepting messages", func() error {
		newCfg, err := daemon.LoadConfig(configPath, log)
		if err != nil {
			return err
		}
		svc.Reload(newCfg)
		return nil
	})
	log.Info("stopping", "why", why)
	daemon.Notify("STOPPING=1")
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShutdown()
	_ = srv.Shutdown(shutdownCtx)
	cancel()
	if err := <-runDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
