package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
)

// DBName is the file name of the service's database in its state directory.
const DBName = "intake.db"

// settings is what intake asks of the configuration; *config.Config answers.
type settings interface {
	Route(connector, channelID, channelName string) (string, error)
	Connector(id string) (config.Connector, bool)
	ConnectorSecret(id string) ([]byte, error)
}

// Service accepts messages over HTTP, forwards them to the scheduler, and
// delivers replies handed to it over D-Bus.
type Service struct {
	cfg         atomic.Pointer[settingsBox]
	store       *store
	log         *slog.Logger
	submitter   atomic.Pointer[submitterBox]
	httpClient  *http.Client
	backoff     backoff
	auth        bus.Authorizer
	callTimeout time.Duration
	now         func() time.Time

	wakeForward chan struct{}
	wakeDeliver chan struct{}

	propsMu sync.Mutex
	props   propertySetter
}

// settingsBox and submitterBox let interface values live in atomic.Pointers.
type (
	settingsBox  struct{ settings }
	submitterBox struct{ Submitter }
)

// Option changes a Service built by New.
type Option func(*Service)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// WithSubmitter sets who receives accepted messages. Without it the service
// keeps messages pending until Export sets a BusSubmitter on the same bus.
func WithSubmitter(sub Submitter) Option {
	return func(s *Service) { s.submitter.Store(&submitterBox{sub}) }
}

// WithHTTPClient sets the client that posts replies (default: 30s timeout).
func WithHTTPClient(c *http.Client) Option { return func(s *Service) { s.httpClient = c } }

// WithRetryDelays sets the first and the longest wait between retries of a
// failed submit or delivery (default 250ms and 30s).
func WithRetryDelays(first, longest time.Duration) Option {
	return func(s *Service) { s.backoff = backoff{min: first, max: longest} }
}

// New opens (or creates) stateDir/intake.db and returns a service that uses cfg.
func New(cfg *config.Config, stateDir string, opts ...Option) (*Service, error) {
	if cfg == nil {
		return nil, errors.New("cannot create intake service: no configuration")
	}
	s := &Service{
		log:         slog.Default(),
		httpClient:  &http.Client{Timeout: 30 * time.Second},
		backoff:     defaultBackoff,
		callTimeout: 30 * time.Second,
		now:         time.Now,
		wakeForward: make(chan struct{}, 1),
		wakeDeliver: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(s)
	}
	s.cfg.Store(&settingsBox{cfg})
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create state directory: %w", err)
	}
	st, err := openStore(filepath.Join(stateDir, DBName))
	if err != nil {
		return nil, fmt.Errorf("cannot create intake service: %w", err)
	}
	s.store = st
	return s, nil
}

// Reload swaps the configuration: new connectors, secrets and routes apply to
// the next request and retry. Queued messages and replies are kept.
func (s *Service) Reload(cfg *config.Config) {
	if cfg == nil {
		return
	}
	s.cfg.Store(&settingsBox{cfg})
	s.log.Info("configuration reloaded")
	// A new reply_url or secret may unblock waiting work.
	wake(s.wakeForward)
	wake(s.wakeDeliver)
}

func (s *Service) config() settings { return s.cfg.Load().settings }

// Run forwards pending messages and delivers pending replies until ctx is
// done, then returns once the calls in flight have finished.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.forwardLoop(ctx) })
	wg.Go(func() { s.deliverLoop(ctx) })
	wg.Wait()
	return nil
}

// Close closes the database. Call it after Run has returned.
func (s *Service) Close() error {
	if err := s.store.Close(); err != nil {
		return fmt.Errorf("cannot close intake database: %w", err)
	}
	return nil
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// refreshCounters publishes the pending counts after a commit changed them.
func (s *Service) refreshCounters() {
	s.propsMu.Lock()
	defer s.propsMu.Unlock()
	if s.props == nil {
		return
	}
	in, out, err := s.store.pendingCounts()
	if err != nil {
		s.log.Warn("cannot refresh pending counters", "err", err)
		return
	}
	s.props.setCounts(in, out)
}

// runLoop calls pass whenever woken, when the delay pass asks for has passed,
// and at start, until ctx is done.
func runLoop(ctx context.Context, wakeUp <-chan struct{}, pass func(context.Context) (time.Duration, bool)) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wakeUp:
		case <-timer.C:
		}
		next, ok := pass(ctx)
		timer.Stop()
		if ok {
			timer.Reset(next)
		}
	}
}
