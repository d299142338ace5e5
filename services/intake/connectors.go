package intake

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
)

// ConnectorFactory builds the connector of one [[connectors]] entry. log
// already carries the connector's id under "connector".
type ConnectorFactory func(c config.Connector, log *slog.Logger) (connector.Connector, error)

// platformFactories are the connector types every Service knows without an
// option: platforms.go registers MeepaChat, Discord and Slack here (in an
// init function). WithConnectorFactory adds to them or replaces one.
var platformFactories = map[string]ConnectorFactory{}

// WithConnectorFactory makes connectors of type typ available. The webhook
// type is built in; platform packages register theirs (platforms.go).
func WithConnectorFactory(typ string, f ConnectorFactory) Option {
	return func(s *Service) { s.factories[typ] = f }
}

// running is one configured connector: what it was built from, and the
// connector (nil when it could not be built; buildErr says why).
type running struct {
	cfg      config.Connector
	conn     connector.Connector
	buildErr string
	handler  http.Handler // the HTTPReceiver's handler, when it has one
	secrets  []string     // resolved credentials, only to keep them out of Status
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run has returned
	// reactionsRefused is the platform's standing refusal of reactions
	// (progress.go), nil while none came.
	reactionsRefused atomic.Pointer[refusal]
}

// connectors holds the running connectors by id.
type connectors struct {
	syncMu sync.Mutex // one syncConnectors at a time
	mu     sync.Mutex
	byID   map[string]*running
	ctx    context.Context // Run's; nil before Run starts the connectors
	wg     sync.WaitGroup
}

// build makes the connector of c, without starting it.
func (s *Service) build(c config.Connector) *running {
	r := &running{cfg: c, done: make(chan struct{})}
	close(r.done) // not started yet
	r.secrets = connectorSecrets(s.config(), c)
	log := s.log.With("connector", c.ID)
	var err error
	switch f, ok := s.factories[c.Type]; {
	case c.Type == config.ConnectorWebhook:
		r.conn = &webhookConnector{svc: s, id: c.ID,
			status: connector.NewStatusKeeper(config.ConnectorWebhook, connector.StateHTTP, s.clock.Now)}
	case !ok:
		err = fmt.Errorf("connector type %q is not available in this berth-intake", c.Type)
	default:
		r.conn, err = f(c, log)
		if err == nil && r.conn == nil {
			err = fmt.Errorf("connector type %q built nothing", c.Type)
		}
	}
	if err != nil {
		r.conn = nil
		r.buildErr = redact(err.Error(), r.secrets)
		log.Error("cannot build connector", "type", c.Type, "err", r.buildErr)
		return r
	}
	if hr, ok := r.conn.(connector.HTTPReceiver); ok {
		r.handler = hr.Handler(s)
	}
	return r
}

// connectorSecrets resolves the credentials of c, so that Status can be
// scrubbed of them; unresolvable ones are simply not listed.
func connectorSecrets(cfg settings, c config.Connector) []string {
	var out []string
	if c.Type == config.ConnectorWebhook {
		if b, err := cfg.ConnectorSecret(c.ID); err == nil {
			out = append(out, string(b))
		}
	}
	if c.Secret != "" {
		out = append(out, c.Secret)
	}
	for _, key := range c.Credentials() {
		if v, err := c.Credential(key, os.Getenv); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// redact replaces every credential in text.
func redact(text string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			text = strings.ReplaceAll(text, sec, "[redacted]")
		}
	}
	return text
}

// syncConnectors builds the connectors cfg lists, keeps those whose entry
// did not change, rebuilds the changed ones and stops the removed ones.
// Connectors are started when Run has started. Building (which may read
// credential files) happens outside the lock.
func (s *Service) syncConnectors(cfg *config.Config) {
	m := &s.conns
	m.syncMu.Lock()
	defer m.syncMu.Unlock()

	m.mu.Lock()
	current := maps.Clone(m.byID)
	m.mu.Unlock()
	next := make(map[string]*running, len(cfg.Connectors))
	var built []*running
	for _, c := range cfg.Connectors {
		if old, ok := current[c.ID]; ok && reflect.DeepEqual(old.cfg, c) {
			next[c.ID] = old
			continue
		}
		if _, ok := current[c.ID]; ok {
			s.log.Info("connector changed; rebuilding it", "connector", c.ID)
		}
		r := s.build(c)
		next[c.ID] = r
		built = append(built, r)
	}

	m.mu.Lock()
	var stop []*running
	for id, old := range m.byID {
		if next[id] != old {
			stop = append(stop, old)
			if _, ok := next[id]; !ok {
				s.log.Info("connector removed", "connector", id)
			}
		}
	}
	if m.ctx != nil {
		for _, r := range built {
			var prev <-chan struct{}
			if old, ok := m.byID[r.cfg.ID]; ok {
				prev = old.done
			}
			s.startLocked(r, prev)
		}
	}
	m.byID = next
	m.mu.Unlock()
	for _, r := range stop {
		if r.cancel != nil {
			r.cancel()
		}
	}
}

// startConnectors starts every connector's Run; called once by Run.
func (s *Service) startConnectors(ctx context.Context) {
	m := &s.conns
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	for _, r := range m.byID {
		s.startLocked(r, nil)
	}
}

// startLocked runs r.conn.Run in its own goroutine until r is stopped, once
// prev (the connector r replaces) has returned. A Run that fails before it is
// told to stop is restarted after a capped back-off.
func (s *Service) startLocked(r *running, prev <-chan struct{}) {
	if r.conn == nil {
		return
	}
	ctx, cancel := context.WithCancel(s.conns.ctx)
	r.cancel = cancel
	r.done = make(chan struct{})
	log := s.log.With("connector", r.cfg.ID)
	if w, ok := r.conn.(connector.StatusWatcher); ok {
		s.conns.wg.Go(func() { s.publishStatusChanges(ctx, w) })
	}
	s.conns.wg.Go(func() {
		defer close(r.done)
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				return
			}
		}
		for attempt := 1; ; attempt++ {
			err := r.conn.Run(ctx, s)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				return // an HTTP-only connector has nothing to hold open
			}
			delay := s.retryDelay.Delay(attempt)
			log.Error("connector stopped; restarting it", "err", redact(err.Error(), r.secrets), "retry_in", delay)
			select {
			case <-ctx.Done():
				return
			case <-s.clock.After(delay):
			}
		}
	})
}

// publishStatusChanges asks for the Connectors property to be published
// each time w's status changes, until ctx ends. Changes coalesce in
// wakePublish; the channel is taken before the wake, so a change made while
// the publisher reads is never missed.
func (s *Service) publishStatusChanges(ctx context.Context, w connector.StatusWatcher) {
	for {
		_, changed := w.WatchStatus()
		s.refreshConnectors()
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// stopConnectors stops every connector and waits for their Run to return.
func (s *Service) stopConnectors() {
	s.conns.mu.Lock()
	for _, r := range s.conns.byID {
		if r.cancel != nil {
			r.cancel()
		}
	}
	s.conns.mu.Unlock()
	s.conns.wg.Wait()
}

// connectorByID returns the running connector of id.
func (s *Service) connectorByID(id string) (*running, bool) {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	r, ok := s.conns.byID[id]
	return r, ok
}

// connectorIDs returns the ids of the configured connectors.
func (s *Service) connectorIDs() []string {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	ids := make([]string, 0, len(s.conns.byID))
	for id := range s.conns.byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ConnectorStatus is one connector as `berthctl status` shows it.
type ConnectorStatus struct {
	ID string
	connector.Status
	Progress  string // [connectors] progress: edit | typing | off, "" for webhooks
	Reactions string // off | on | why the platform refuses them (running.reactionsState)
}

// ConnectorStatuses returns every configured connector's status, by id.
// No field ever holds a credential.
func (s *Service) ConnectorStatuses() []ConnectorStatus {
	s.conns.mu.Lock()
	rs := make([]*running, 0, len(s.conns.byID))
	var secrets []string // every connector's: one must not show another's either
	for _, r := range s.conns.byID {
		rs = append(rs, r)
		secrets = append(secrets, r.secrets...)
	}
	s.conns.mu.Unlock()
	out := make([]ConnectorStatus, 0, len(rs))
	for _, r := range rs {
		st := connector.Status{Type: r.cfg.Type, State: connector.StateStopped, LastError: r.buildErr}
		if r.conn != nil {
			st = r.conn.Status()
			if st.Type == "" {
				st.Type = r.cfg.Type
			}
		}
		st.LastError = redact(st.LastError, secrets)
		st.Warning = redact(st.Warning, secrets)
		mode, _ := progressOf(r)
		out = append(out, ConnectorStatus{ID: r.cfg.ID, Status: st, Progress: mode, Reactions: redact(r.reactionsState(), secrets)})
	}
	slices.SortFunc(out, func(a, b ConnectorStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// HasLongLivedConnector reports whether a configured connector holds a
// connection open (a WebSocket gateway): intake must then not exit idle.
// Connectors that cannot be built count by their type, so that fixing one
// does not depend on a socket activation that never comes.
func (s *Service) HasLongLivedConnector() bool {
	s.conns.mu.Lock()
	defer s.conns.mu.Unlock()
	for _, r := range s.conns.byID {
		if r.conn == nil {
			if longLivedType(r.cfg) {
				return true
			}
			continue
		}
		if ll, ok := r.conn.(connector.LongLived); ok && ll.LongLived() {
			return true
		}
	}
	return false
}

// webhookConnector is the built-in webhook type: it receives in serveHook
// and posts replies to reply_url, signed like incoming webhooks.
type webhookConnector struct {
	svc    *Service
	id     string
	status *connector.StatusKeeper
}

func (w *webhookConnector) Run(context.Context, connector.Sink) error { return nil }

// Send is not used: intake posts the whole outbox entry (post), which holds
// more than a Reply.
func (w *webhookConnector) Send(context.Context, connector.Reply) error {
	return &connector.PermanentError{Reason: "webhook replies are posted by intake"}
}

func (w *webhookConnector) Status() connector.Status { return w.status.Snapshot() }

func (w *webhookConnector) WatchStatus() (connector.Status, <-chan struct{}) { return w.status.Watch() }

func (w *webhookConnector) noteEvent(at time.Time) { w.status.Saw(at) }

// noteError records a reply POST's outcome: a failure is the last error
// (with its time) until a later POST succeeds.
func (w *webhookConnector) noteError(err error) {
	if err != nil {
		w.status.Failed(err)
	} else {
		w.status.Healthy()
	}
}
