package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
)

// ErrIdle ends Serve when the daemon had nothing to do for
// Options.IdleAfter; ExitCode maps it to ExitIdle.
var ErrIdle = errors.New("idle")

// Seams are the daemon's side effects on the world; zero values are the real
// ones, and tests hand in fakes.
type Seams struct {
	// Logger receives the daemon's logs (default slog.Default()).
	Logger *slog.Logger
	// Notifier talks to the service manager (default SystemdNotifier).
	Notifier Notifier
	// Clock drives the watchdog and idle timers (default the real clock).
	Clock clockwork.Clock
	// Signals delivers SIGTERM, SIGINT and SIGHUP (default: the process's
	// own, through signal.Notify).
	Signals <-chan os.Signal
}

// Options is one daemon's work and how it is stopped.
type Options struct {
	// Name is the binary's name ("berth-intake"), used in messages.
	Name string
	// Status is what systemctl status shows while serving ("accepting messages").
	Status string

	// Run is the service's work loop: it runs until ctx is canceled. When it
	// returns before it was asked to stop (nil or an error), the daemon
	// stops and Serve returns why, so the process exits non-zero and systemd
	// restarts it rather than leaving a D-Bus object without work behind it.
	Run func(ctx context.Context) error
	// Reload applies a new configuration on SIGHUP. Its error is logged
	// with the text of every problem (file, line, key) and the running
	// configuration keeps serving. Nil: SIGHUP only re-announces READY.
	Reload func() error
	// BusLost is closed when the D-Bus connection ends: the daemon stops
	// with an error, since it can no longer be reached.
	BusLost <-chan struct{}
	// Progress reports when the work loop last proved it is alive. The
	// watchdog is pinged only while that is more recent than WatchdogSec=,
	// so systemd restarts a daemon whose loop is stuck. Nil: the watchdog is
	// pinged for as long as Run has not returned.
	Progress func() time.Time

	// Listeners, when any, serve Handler over HTTP until the daemon stops.
	Listeners []net.Listener
	Handler   http.Handler
	// ShutdownTimeout bounds how long requests in flight may finish when
	// the daemon stops (default 10s).
	ShutdownTimeout time.Duration

	// IdleAfter, when positive, stops the daemon with ErrIdle after that
	// long with no HTTP request in flight and Busy reporting false.
	IdleAfter time.Duration
	Busy      func() bool

	Seams
}

// Daemon runs one service's lifecycle under systemd, or outside it.
type Daemon struct {
	opts     Options
	log      *slog.Logger
	notifier Notifier
	clock    clockwork.Clock
	quit     chan struct{}
	quitOnce sync.Once
}

// New returns a daemon for opts; Serve runs it.
func New(opts Options) *Daemon {
	d := &Daemon{opts: opts, log: opts.Logger, notifier: opts.Notifier, clock: opts.Clock, quit: make(chan struct{})}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.notifier == nil {
		d.notifier = SystemdNotifier{}
	}
	if d.clock == nil {
		d.clock = clockwork.NewRealClock()
	}
	if d.opts.ShutdownTimeout <= 0 {
		d.opts.ShutdownTimeout = 10 * time.Second
	}
	if d.opts.Name == "" {
		d.opts.Name = "the daemon"
	}
	return d
}

// Quit asks Serve to stop as SIGTERM does.
func (d *Daemon) Quit() { d.quitOnce.Do(func() { close(d.quit) }) }

// Serve starts the work loop and the HTTP listeners, tells the service
// manager it is ready once its signal handlers are in place, and runs until
// it is asked to stop (SIGTERM, SIGINT, Quit, ctx done: it returns nil) or
// cannot go on (the work loop or a listener ended, the bus connection was
// lost: it returns why; idle: ErrIdle). It returns once the work loop has
// finished.
func (d *Daemon) Serve(ctx context.Context) error {
	if d.opts.Run == nil {
		return errors.New("cannot serve: no work loop")
	}
	sigs := d.opts.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}

	// The work loop outlives ctx until the listeners have drained.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	started := d.clock.Now()
	runDone := make(chan error, 1)
	go func() { runDone <- d.opts.Run(workCtx) }()

	idle := NewIdle(d.clock)
	srv, listenerFailed := d.serveHTTP(idle)

	idleCtx, stopIdle := context.WithCancel(ctx)
	defer stopIdle()
	idled := make(chan struct{})
	if d.opts.IdleAfter > 0 {
		go func() {
			if idle.Wait(idleCtx, d.opts.IdleAfter, d.opts.Busy) {
				close(idled)
			}
		}()
	}

	dog := d.newWatchdog(started)
	defer dog.stop()

	d.notify("READY=1\nSTATUS=" + d.opts.Status)
	st := d.wait(ctx, sigs, runDone, listenerFailed, idled, dog)
	err := st.err
	if err != nil && !errors.Is(err, ErrIdle) {
		d.log.Error("stopping: " + err.Error())
		d.notify("STOPPING=1\nSTATUS=stopping: " + err.Error())
	} else {
		d.log.Info("stopping: " + st.why)
		d.notify("STOPPING=1\nSTATUS=stopping: " + st.why)
	}

	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.ShutdownTimeout)
		if serr := srv.Shutdown(shutdownCtx); serr != nil {
			d.log.Warn("HTTP requests still in flight were cut off: " + serr.Error())
		}
		cancel()
	}
	stopWork()
	if !st.runEnded {
		if rerr := <-runDone; rerr != nil && !errors.Is(rerr, context.Canceled) && (err == nil || errors.Is(err, ErrIdle)) {
			err = fmt.Errorf("the work loop failed while stopping: %w", rerr)
		}
	}
	return err
}

// stop is why a daemon stops: why for a stop it was asked for, err when it
// cannot go on (or ErrIdle); runEnded when Run has already returned.
type stop struct {
	why      string
	err      error
	runEnded bool
}

// wait is Serve's main loop; it returns when the daemon must stop.
func (d *Daemon) wait(ctx context.Context, sigs <-chan os.Signal, runDone <-chan error, listenerFailed <-chan error, idled <-chan struct{}, dog *watchdog) stop {
	for {
		select {
		case <-ctx.Done():
			return stop{why: "asked to stop (" + context.Cause(ctx).Error() + ")"}
		case <-d.quit:
			return stop{why: "asked to stop"}
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				d.reload()
				continue
			}
			return stop{why: "signal " + sig.String()}
		case <-d.opts.BusLost:
			return stop{err: errors.New("lost the D-Bus connection; exiting so that systemd or the bus starts " + d.opts.Name + " again")}
		case rerr := <-runDone:
			if rerr == nil {
				rerr = errors.New("it returned without being asked to stop")
			}
			return stop{err: fmt.Errorf("the work loop ended: %w; exiting so that systemd restarts %s", rerr, d.opts.Name), runEnded: true}
		case lerr := <-listenerFailed:
			return stop{err: lerr}
		case <-idled:
			return stop{why: fmt.Sprintf("idle for %s with nothing pending", d.opts.IdleAfter), err: ErrIdle}
		case <-dog.ticks():
			dog.check()
		}
	}
}

func (d *Daemon) reload() {
	d.notify("RELOADING=1\nMONOTONIC_USEC=" + d.notifier.Monotonic())
	if d.opts.Reload == nil {
		d.notify("READY=1")
		return
	}
	if err := d.opts.Reload(); err != nil {
		first := logRefused(d.log, "config refused, the running one keeps serving: ", err)
		d.notify("READY=1\nSTATUS=" + d.opts.Status + " (last reload refused: " + first + ")")
		return
	}
	d.log.Info("config reloaded")
	d.notify("READY=1\nSTATUS=" + d.opts.Status)
}

// serveHTTP serves Handler on every listener; a listener that fails is
// reported on the returned channel. It returns a nil server when there is
// nothing to serve.
func (d *Daemon) serveHTTP(idle *Idle) (*http.Server, <-chan error) {
	failed := make(chan error, len(d.opts.Listeners))
	if len(d.opts.Listeners) == 0 || d.opts.Handler == nil {
		return nil, failed
	}
	srv := &http.Server{
		Handler:           idle.Handler(d.opts.Handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	for _, l := range d.opts.Listeners {
		addr := l.Addr().String()
		d.log.Info("accepting HTTP on "+addr, "addr", addr)
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("the HTTP listener on %s failed: %w", addr, err)
			}
		}()
	}
	return srv, failed
}

func (d *Daemon) notify(state string) {
	if err := d.notifier.Notify(state); err != nil {
		d.log.Debug("sd_notify failed", "state", state, "err", err)
	}
}
