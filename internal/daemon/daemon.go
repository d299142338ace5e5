// Package daemon is the plumbing every berth service shares with systemd:
// socket-activated listeners by name, sd_notify, logging to the journal, and
// where config and state live. The same code runs outside systemd: listeners
// come from flags, notifications are no-ops, logs go to stderr.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/berth-dev/berth/internal/config"
)

// ConfigPath is the config file to load: flag value, else $BERTH_CONFIG, else
// /etc/berth/berth.toml.
func ConfigPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if p := os.Getenv("BERTH_CONFIG"); p != "" {
		return p
	}
	return "/etc/berth/berth.toml"
}

// StateDir is the service's own state directory: flag value, else systemd's
// $STATE_DIRECTORY (set by StateDirectory=berth/<service>), else
// $BERTH_STATE_DIR/<service>, else /var/lib/berth/<service>. It is created
// (0755) when missing.
func StateDir(flagValue, service string) (string, error) {
	dir := flagValue
	if dir == "" {
		dir = os.Getenv("STATE_DIRECTORY")
	}
	if dir == "" {
		base := os.Getenv("BERTH_STATE_DIR")
		if base == "" {
			base = "/var/lib/berth"
		}
		dir = filepath.Join(base, service)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("cannot resolve state directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("cannot create state directory: %w", err)
	}
	return abs, nil
}

// ActivationListeners returns the sockets systemd passed with
// FileDescriptorName=name (or, when exactly one unnamed socket was passed,
// that one). None passed is not an error: the caller listens by itself.
func ActivationListeners(name string) ([]net.Listener, error) {
	if os.Getenv("LISTEN_FDS") == "" {
		return nil, nil
	}
	byName, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("cannot use socket activation: %w", err)
	}
	if ls := byName[name]; len(ls) > 0 {
		return ls, nil
	}
	if ls := byName["unknown"]; len(ls) > 0 && len(byName) == 1 {
		return ls, nil
	}
	var names []string
	for n := range byName {
		names = append(names, n)
	}
	return nil, fmt.Errorf("socket activation passed no socket named %q (got %v): set FileDescriptorName=%s", name, names, name)
}

// Notify sends sd_notify states ("READY=1", "STATUS=...", "STOPPING=1").
// Outside systemd it does nothing.
func Notify(state string) {
	if _, err := sddaemon.SdNotify(false, state); err != nil {
		slog.Debug("sd_notify failed", "state", state, "err", err)
	}
}

// Loop tells systemd the service is ready (with status) once its signal
// handlers are in place, then blocks until the service should stop: SIGTERM
// or SIGINT, the bus connection ending, or ctx done; it returns why. SIGHUP
// calls reload, which logs and keeps the old config on error. Under
// WatchdogSec= it pings the watchdog from this loop, so a wedged loop gets
// the service restarted.
func Loop(ctx context.Context, log *slog.Logger, busDone <-chan struct{}, status string, reload func() error) string {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	Notify("READY=1\nSTATUS=" + status)
	watchdog, stopWatchdog := watchdogTicks()
	defer stopWatchdog()
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
			Notify("RELOADING=1\nMONOTONIC_USEC=" + sddaemon.SdNotifyMonotonicUsec())
			if err := reload(); err != nil {
				log.Error("config reload refused; the old config keeps serving", "err", err)
			} else {
				log.Info("config reloaded")
			}
			Notify("READY=1")
		}
	}
}

// LoadConfig loads the config and logs each error on its own line (file,
// line and key), so the journal shows what to fix.
func LoadConfig(path string, log *slog.Logger) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		var errs config.Errors
		if errors.As(err, &errs) {
			for _, e := range errs {
				log.Error("bad config", "file", e.File, "line", e.Line, "key", e.Key, "err", e.Msg)
			}
		}
		return nil, fmt.Errorf("cannot load config %s: %w", path, err)
	}
	return cfg, nil
}
