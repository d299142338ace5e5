package daemon

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
)

// Notify sends one sd_notify message through SystemdNotifier.
//
// Deprecated: for cmd/berth-scheduler until it runs under Main; a Daemon
// notifies by itself.
func Notify(state string) {
	if err := (SystemdNotifier{}).Notify(state); err != nil {
		slog.Debug("sd_notify failed", "state", state, "err", err)
	}
}

// Loop tells systemd the service is ready once its signal handlers are in
// place, then blocks until SIGTERM or SIGINT, the bus connection ending, or
// ctx done, and returns why. SIGHUP calls reload; a refused config is logged
// with file, line and key in the message text, and the old one keeps serving.
//
// Deprecated: for cmd/berth-scheduler until it runs under Main, which also
// stops when the work loop ends and feeds the watchdog from its progress.
func Loop(ctx context.Context, log *slog.Logger, busDone <-chan struct{}, status string, reload func() error) string {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	n := SystemdNotifier{}
	Notify("READY=1\nSTATUS=" + status)
	var watchdog <-chan time.Time
	if interval, err := n.WatchdogInterval(); err == nil && interval > 0 {
		t := clockwork.NewRealClock().NewTicker(interval / 2)
		defer t.Stop()
		watchdog = t.Chan()
	}
	for {
		select {
		case <-watchdog:
			Notify("WATCHDOG=1")
		case <-ctx.Done():
			return "context done"
		case <-busDone:
			return "bus connection lost"
		case sig := <-sigs:
			if sig != syscall.SIGHUP {
				return "signal " + sig.String()
			}
			Notify("RELOADING=1\nMONOTONIC_USEC=" + n.Monotonic())
			if err := reload(); err != nil {
				logRefused(log, "config refused, the running one keeps serving: ", err)
			} else {
				log.Info("config reloaded")
			}
			Notify("READY=1")
		}
	}
}
