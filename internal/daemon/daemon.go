// Package daemon is the one lifecycle every berth service runs under systemd:
// socket-activated listeners by name, READY/RELOADING/STOPPING, SIGHUP
// reload, SIGTERM stop, the bus connection's loss, idle exit, a watchdog fed
// by the work loop's progress, and an exit status that tells systemd what
// happened (Main, Daemon.Serve). It also holds logging to the journal and
// where config and state live. The same code runs outside systemd: listeners
// come from flags, notifications are no-ops, logs go to stderr.
package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/coreos/go-systemd/v22/activation"
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
