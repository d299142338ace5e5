package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
)

// Service is what every berth daemon serves: a work loop, a configuration it
// can swap, a D-Bus object, and a database to close once the loop is done.
type Service interface {
	Run(ctx context.Context) error
	Reload(cfg *config.Config)
	Export(conn *dbus.Conn) error
	Close() error
}

// Env is what a service is built from.
type Env struct {
	Config   *config.Config
	StateDir string
	Bus      *dbus.Conn
	Log      *slog.Logger
}

// Spec describes one berth daemon for Main: the service it builds and what
// of the lifecycle it uses.
type Spec[S Service] struct {
	// Name is the binary's name and the journal's SYSLOG_IDENTIFIER ("berth-intake").
	Name string
	// StateName is the state directory's name under /var/lib/berth ("intake").
	StateName string
	// Status is what systemctl status shows while serving.
	Status string
	// ConfigFlag and StateFlag are the --config and --state-dir values ("": defaults).
	ConfigFlag, StateFlag string

	// New builds the service; it is closed after its work loop has ended.
	New func(Env) (S, error)
	// Progress reports when the service's work loop last made progress, for
	// the watchdog (see Options.Progress). Nil: pinged while Run runs.
	Progress func(S) time.Time

	// HTTP, when set, is served on the activation socket named HTTPSocket
	// (FileDescriptorName=, default "http"), or when not socket-activated
	// on the address Listen returns ("": no HTTP listener).
	HTTP       func(S) http.Handler
	HTTPSocket string
	Listen     func(*config.Config) string

	// IdleAfter, when positive, ends the daemon with ExitIdle after that long
	// without requests while Busy reports false.
	IdleAfter time.Duration
	Busy      func(S) bool

	Seams
	// ActivationListeners returns the sockets systemd passed by name
	// (default ActivationListeners).
	ActivationListeners func(name string) ([]net.Listener, error)
	// ConnectBus connects to the system bus (default bus.ConnectSystem).
	ConnectBus func() (*dbus.Conn, error)
}

// Main runs the daemon spec describes until it stops and returns its exit
// status: 0 when asked to stop, ExitIdle when idle, 1 (with the reason
// logged) when it cannot start or cannot go on, so systemd restarts it.
func Main[S Service](spec Spec[S]) int {
	log := spec.Logger
	if log == nil {
		log = SetupLogging(spec.Name)
		spec.Logger = log
	}
	return ExitCode(log, spec.Name, serve(context.Background(), spec))
}

// ExitCode maps Serve's result to an exit status, logging a failure.
func ExitCode(log *slog.Logger, name string, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrIdle):
		return ExitIdle
	default:
		log.Error(name + " exits with status 1: " + err.Error())
		return 1
	}
}

func serve[S Service](ctx context.Context, spec Spec[S]) error {
	log := spec.Logger
	configPath := ConfigPath(spec.ConfigFlag)
	cfg, err := LoadConfig(configPath, nil)
	if err != nil {
		logRefused(log, "config refused: ", err)
		return fmt.Errorf("cannot start with the config in %s: it was refused (see the lines above)", configPath)
	}
	stateDir, err := StateDir(spec.StateFlag, spec.StateName)
	if err != nil {
		return err
	}
	connect := spec.ConnectBus
	if connect == nil {
		connect = bus.ConnectSystem
	}
	conn, err := connect()
	if err != nil {
		return err
	}
	defer conn.Close()

	svc, err := spec.New(Env{Config: cfg, StateDir: stateDir, Bus: conn, Log: log})
	if err != nil {
		return err
	}
	defer func() {
		if err := svc.Close(); err != nil {
			log.Error(err.Error())
		}
	}()
	if err := svc.Export(conn); err != nil {
		return err
	}

	opts := Options{
		Name:    spec.Name,
		Status:  spec.Status,
		Run:     svc.Run,
		BusLost: conn.Context().Done(),
		Reload: func() error {
			newCfg, err := LoadConfig(configPath, nil)
			if err != nil {
				return err
			}
			svc.Reload(newCfg)
			return nil
		},
		IdleAfter: spec.IdleAfter,
		Seams:     spec.Seams,
	}
	if spec.Progress != nil {
		opts.Progress = func() time.Time { return spec.Progress(svc) }
	}
	if spec.Busy != nil {
		opts.Busy = func() bool { return spec.Busy(svc) }
	}
	if spec.HTTP != nil {
		listeners, err := httpListeners(spec, cfg)
		if err != nil {
			return err
		}
		if len(listeners) == 0 {
			log.Info("no HTTP listener (not socket-activated and no address to listen on): serving D-Bus only")
		}
		opts.Listeners, opts.Handler = listeners, spec.HTTP(svc)
	}
	return New(opts).Serve(ctx)
}

// httpListeners are the activation sockets named spec.HTTPSocket, or else a
// socket of its own on the address spec.Listen returns.
func httpListeners[S Service](spec Spec[S], cfg *config.Config) ([]net.Listener, error) {
	name := spec.HTTPSocket
	if name == "" {
		name = "http"
	}
	activated := spec.ActivationListeners
	if activated == nil {
		activated = ActivationListeners
	}
	listeners, err := activated(name)
	if err != nil || len(listeners) > 0 {
		return listeners, err
	}
	if spec.Listen == nil {
		return nil, nil
	}
	addr := spec.Listen(cfg)
	if addr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	return []net.Listener{l}, nil
}
