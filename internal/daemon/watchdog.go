package daemon

import (
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"
)

// watchdog pings systemd's watchdog (WatchdogSec=) every half interval, but
// only while the work loop proves progress: a loop stuck for longer than the
// interval gets no more pings, so systemd kills and restarts the daemon.
type watchdog struct {
	d        *Daemon
	interval time.Duration
	ticker   clockwork.Ticker
	started  time.Time
	stuck    bool
}

func (d *Daemon) newWatchdog(started time.Time) *watchdog {
	w := &watchdog{d: d, started: started}
	interval, err := d.notifier.WatchdogInterval()
	if err != nil {
		d.log.Warn("the watchdog is off: " + err.Error())
		return w
	}
	if interval > 0 {
		w.interval = interval
		w.ticker = d.clock.NewTicker(interval / 2)
	}
	return w
}

// ticks fires when the watchdog is due a check; never without a watchdog.
func (w *watchdog) ticks() <-chan time.Time {
	if w.ticker == nil {
		return nil
	}
	return w.ticker.Chan()
}

func (w *watchdog) stop() {
	if w.ticker != nil {
		w.ticker.Stop()
	}
}

// check pings when the work loop progressed within the interval, and says
// once when it stops (and when it resumes) pinging.
func (w *watchdog) check() {
	if w.d.opts.Progress == nil {
		w.d.notify("WATCHDOG=1")
		return
	}
	now := w.d.clock.Now()
	last := w.started
	if p := w.d.opts.Progress(); p.After(last) {
		last = p
	}
	since := now.Sub(last)
	if since <= w.interval {
		w.d.notify("WATCHDOG=1")
		if w.stuck {
			w.stuck = false
			w.d.log.Info("the work loop progresses again; watchdog pings resume")
			w.d.notify("STATUS=" + w.d.opts.Status)
		}
		return
	}
	if !w.stuck {
		w.stuck = true
		msg := fmt.Sprintf("the work loop has been stuck for %s (no progress since %s): no more watchdog pings, systemd restarts %s after WatchdogSec=%s",
			since.Round(time.Millisecond), last.UTC().Format(time.RFC3339), w.d.opts.Name, w.interval)
		w.d.log.Error(msg, "stuck_for", since.String())
		w.d.notify("STATUS=" + msg)
	}
}
