package daemon

import (
	"fmt"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

// Notifier is how a daemon talks to its service manager. SystemdNotifier is
// the real one; tests hand in one that records what was sent.
type Notifier interface {
	// Notify sends one sd_notify message ("READY=1\nSTATUS=...").
	Notify(state string) error
	// WatchdogInterval is the WatchdogSec= the manager expects pings within,
	// or 0 when there is no watchdog.
	WatchdogInterval() (time.Duration, error)
	// Monotonic is the CLOCK_MONOTONIC time in microseconds, which
	// RELOADING=1 carries (MONOTONIC_USEC=) for Type=notify-reload.
	Monotonic() string
}

// SystemdNotifier speaks sd_notify on $NOTIFY_SOCKET and reads
// $WATCHDOG_USEC. Outside systemd (no socket) it sends nothing and reports
// no watchdog.
type SystemdNotifier struct{}

func (SystemdNotifier) Notify(state string) error {
	if _, err := sddaemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("cannot notify the service manager: %w", err)
	}
	return nil
}

func (SystemdNotifier) WatchdogInterval() (time.Duration, error) {
	d, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("cannot read the watchdog interval: %w", err)
	}
	return d, nil
}

func (SystemdNotifier) Monotonic() string { return sddaemon.SdNotifyMonotonicUsec() }
