package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
)

// DBName is the file name of the service's database in its state directory.
const DBName = "intake.db"

// settings is what intake asks of the configuration; *config.Config answers.
type settings interface {
	RouteMessage(connector, channelID, channelName, serverID string) (string, error)
	Connector(id string) (config.Connector, bool)
	ConnectorSecret(id string) ([]byte, error)
	IntakeSettings() config.Intake
}

// Service accepts messages from its connectors (and webhooks over HTTP),
// forwards them to the scheduler, and delivers replies handed to it over
// D-Bus through the connector each message came from.
type Service struct {
	stateDir    string
	cfg         atomic.Pointer[settingsBox]
	retention   atomic.Int64 // time.Duration of [retention] delivered
	store       *store
	replyFiles  replyFileStore // replyfiles.go
	log         *slog.Logger
	submitter   atomic.Pointer[submitterBox]
	httpClient  *http.Client
	retryDelay  backoff.Policy
	auth        bus.Authorizer
	callTimeout time.Duration
	clock       clockwork.Clock
	factories   map[string]ConnectorFactory
	conns       connectors

	wakeForward  chan struct{}
	wakeDeliver  chan struct{}
	wakePublish  chan struct{}
	forwardOn    atomic.Pointer[lanes] // per-connector Submit workers, while Run runs
	deliverOn    atomic.Pointer[lanes] // per-connector reply workers, while Run runs
	submitWindow int                   // Submits in flight per connector (submitWindow; benchmarks change it)
	forwardLanes sync.Map              // connector id → *forwardLane (retry state, in memory)
	typing       typingSet
	progress     progressBoard // progress.go

	// Unix nanoseconds of the last pass of the forward and deliver loops.
	forwardPassed, deliverPassed atomic.Int64
	// passed, when set (tests), is told of each loop's pass.
	passed func(loop string)

	propsMu sync.Mutex
	props   propertySetter

	metrics *intakeMetrics // metrics.go
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

// WithClock sets the clock of every timer and timestamp (default: the real
// one); tests drive retries and retention with a fake clock.
func WithClock(c clockwork.Clock) Option { return func(s *Service) { s.clock = c } }

// WithHTTPClient sets the client that posts replies (default: 30s timeout).
func WithHTTPClient(c *http.Client) Option { return func(s *Service) { s.httpClient = c } }

// defaultRetryDelay spaces the retries of a failed submit or delivery.
var defaultRetryDelay = backoff.Policy{Min: 250 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.25}

// WithRetryDelays sets the first and the longest wait between retries of a
// failed submit or delivery (default 250ms and 30s).
func WithRetryDelays(first, longest time.Duration) Option {
	return func(s *Service) { s.retryDelay = backoff.Policy{Min: first, Max: longest, Jitter: 0.25} }
}

// New opens (or creates) stateDir/intake.db and returns a service that uses cfg.
func New(cfg *config.Config, stateDir string, opts ...Option) (*Service, error) {
	if cfg == nil {
		return nil, errors.New("cannot create intake service: no configuration")
	}
	s := &Service{
		stateDir:     stateDir,
		log:          slog.Default(),
		httpClient:   &http.Client{Timeout: 30 * time.Second},
		retryDelay:   defaultRetryDelay,
		callTimeout:  30 * time.Second,
		submitWindow: submitWindow,
		clock:        clockwork.NewRealClock(),
		factories:    maps.Clone(platformFactories),
		wakeForward:  make(chan struct{}, 1),
		wakeDeliver:  make(chan struct{}, 1),
		wakePublish:  make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(s)
	}
	s.cfg.Store(&settingsBox{cfg})
	s.retention.Store(int64(retentionOf(cfg)))
	now := s.clock.Now().UnixNano()
	s.forwardPassed.Store(now)
	s.deliverPassed.Store(now)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create state directory: %w", err)
	}
	st, err := openStore(filepath.Join(stateDir, DBName))
	if err != nil {
		return nil, fmt.Errorf("cannot create intake service: %w", err)
	}
	s.store = st
	s.replyFiles = replyFileStore{dir: filepath.Join(stateDir, replyFilesDir)}
	st.w.SetLogger(s.log.With("db", DBName))
	s.metrics = newIntakeMetrics(s)
	if err := s.sweepFiles(); err != nil {
		s.log.Warn("cannot sweep attachments left by an earlier process", "err", err)
	}
	s.syncConnectors(cfg)
	return s, nil
}

// Reload swaps the configuration: new routes and secrets apply to the next
// message and retry; connectors whose entry changed are rebuilt, removed ones
// stopped, new ones started. Queued messages and replies are kept.
func (s *Service) Reload(cfg *config.Config) {
	if cfg == nil {
		return
	}
	s.cfg.Store(&settingsBox{cfg})
	s.retention.Store(int64(retentionOf(cfg)))
	s.syncConnectors(cfg)
	s.log.Info("configuration reloaded")
	s.refreshConnectors()
	// A new reply_url or secret may unblock waiting work.
	wake(s.wakeForward)
	wake(s.wakeDeliver)
}

func (s *Service) config() settings { return s.cfg.Load().settings }

// idlePass is the longest the forward and deliver loops wait between
// passes, so that LastProgress moves while nothing happens.
const idlePass = 5 * time.Second

// Run runs the connectors, forwards pending messages (one worker per
// connector), delivers pending replies (one worker per connector) and prunes
// finished entries, until ctx is done; then it returns once the calls in
// flight have finished.
func (s *Service) Run(ctx context.Context) error {
	fwd := newLanes(ctx, s.clock, s.forwardConnector, func(c string) { s.notePass("forward/"+c, nil) })
	dlv := newLanes(ctx, s.clock, s.deliverConnector, func(c string) { s.notePass("deliver/"+c, nil) })
	s.forwardOn.Store(fwd)
	s.deliverOn.Store(dlv)
	s.startConnectors(ctx)
	s.deleteLeftoverProgress()
	var wg sync.WaitGroup
	wg.Go(func() {
		runLoop(ctx, s.clock, s.wakeForward, idlePass, s.forwardPass, func() { s.notePass("forward", &s.forwardPassed) })
	})
	wg.Go(func() {
		runLoop(ctx, s.clock, s.wakeDeliver, idlePass, s.deliverPass, func() { s.notePass("deliver", &s.deliverPassed) })
	})
	wg.Go(func() { s.typingLoop(ctx) })
	wg.Go(func() { s.retentionLoop(ctx) })
	wg.Wait()
	fwd.wait()
	dlv.wait()
	s.stopConnectors()
	return nil
}

// LastProgress is when the forward and deliver loops both last made a pass
// (the older of the two). Each passes at least every 5 s, so a watchdog can
// tell a stuck service from an idle one.
func (s *Service) LastProgress() time.Time {
	return time.Unix(0, min(s.forwardPassed.Load(), s.deliverPassed.Load()))
}

// notePass records a loop's pass (at, when the loop counts for LastProgress)
// and tells a test's hook.
func (s *Service) notePass(loop string, at *atomic.Int64) {
	if at != nil {
		at.Store(s.clock.Now().UnixNano())
	}
	if s.passed != nil {
		s.passed(loop)
	}
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

// refreshCounters and refreshConnectors ask publish to send the properties
// again after a commit or a connector changed them.
func (s *Service) refreshCounters()   { wake(s.wakePublish) }
func (s *Service) refreshConnectors() { wake(s.wakePublish) }

// publish sends changed properties, one change at a time and never under a
// lock, until done (the bus connection ends).
func (s *Service) publish(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-s.wakePublish:
		}
		s.propsMu.Lock()
		p := s.props
		s.propsMu.Unlock()
		if p == nil {
			continue
		}
		p.setCounts(s.store.pendingCounts())
		p.setConnectors(s.ConnectorStatuses())
	}
}
