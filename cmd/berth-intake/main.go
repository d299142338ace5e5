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
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
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
	idleFlag := flag.Duration("idle-exit", 0, "exit with status 75 after this long with nothing to do, unless a long-lived connector is configured (0: never)")
	flag.Parse()
	log := daemon.SetupLogging("berth-intake")
	err := serve(*configFlag, *stateFlag, *listenFlag, *idleFlag)
	if errors.Is(err, errIdle) {
		return daemon.ExitIdle
	}
	if err != nil {
		log.Error("berth-intake failed", "err", err)
		return 1
	}
	return 0
}

// errIdle ends serve when --idle-exit found nothing to do.
var errIdle = errors.New("idle")

func serve(configFlag, stateFlag, listenFlag string, idleExit time.Duration) error {
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
	idle := daemon.NewIdle()
	srv := &http.Server{
		Handler:           idle.Handler(svc.Handler()),
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

	loopCtx, stopLoop := context.WithCancelCause(ctx)
	defer stopLoop(nil)
	var current atomic.Pointer[config.Config]
	current.Store(cfg)
	if idleExit > 0 {
		go func() {
			if idle.Wait(loopCtx, idleExit, func() bool { return hasWork(svc, current.Load()) }) {
				stopLoop(errIdle)
			}
		}()
	}
	why := daemon.Loop(loopCtx, log, conn.Context().Done(), "accepting messages", func() error {
		newCfg, err := daemon.LoadConfig(configPath, log)
		if err != nil {
			return err
		}
		svc.Reload(newCfg)
		current.Store(newCfg)
		return nil
	})
	idled := errors.Is(context.Cause(loopCtx), errIdle)
	if idled {
		why = fmt.Sprintf("idle for %s with nothing pending", idleExit)
	}
	log.Info("stopping", "why", why)
	daemon.Notify("STOPPING=1")
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShutdown()
	_ = srv.Shutdown(shutdownCtx)
	cancel()
	if err := <-runDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if idled {
		return errIdle
	}
	return nil
}

// hasWork reports whether intake must keep running: messages or replies are
// pending, or a long-lived connector needs its connection.
func hasWork(svc *intake.Service, cfg *config.Config) bool {
	if intake.HasLongLivedConnector(cfg) {
		return true
	}
	inbox, outbox, err := svc.Pending()
	return err != nil || inbox > 0 || outbox > 0
}
