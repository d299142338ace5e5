package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// Errors callers can tell apart (errors.Is); the D-Bus object maps them to
// dev.berth.Error.NotFound and dev.berth.Error.InvalidArgument.
var (
	ErrNotFound        = errors.New("not found")
	ErrInvalidArgument = errors.New("invalid argument")
)

// Reasons the scheduler itself gives a run (the backends' are in isolation).
const (
	ReasonContainerUnavailable = "container isolation is not available in this build"
	ReasonInterruptedTwice     = "interrupted twice by scheduler restarts"
	ReasonAgentNotConfigured   = "agent is not configured"
	ReasonNoBackend            = "isolation backend is not available"
	ReasonInternal             = "internal error"
)

// Cancel causes of a run's context: a user's CancelRun ends the run, a
// graceful stop hands it back to the queue.
var (
	errCanceledByUser = errors.New("canceled by CancelRun")
	errShutdown       = errors.New("scheduler is stopping")
)

// maxStderrTail bounds the stderr kept in a run record.
const maxStderrTail = 8 << 10

// Options are the scheduler's side effects and seams.
type Options struct {
	// Backends maps an agent's Isolation ("landlock", "unrestricted",
	// "container") to the backend that runs it.
	Backends map[string]isolation.Backend
	// Deliverer hands finished runs to intake. Nil keeps them pending (they
	// are delivered by a later scheduler that has one).
	Deliverer Deliverer
	// Getenv reads provider keys (api_key_env); nil means os.Getenv.
	Getenv func(string) string
	// ConfigDir is protected from agents; empty means the directories of the
	// loaded config files (Config.Sources).
	ConfigDir string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Service is berth-scheduler: the store, the dispatcher, the deliveries and
// the D-Bus object.
type Service struct {
	opts     Options
	stateDir string
	store    *store
	cfg      atomic.Pointer[config.Config]
	log      *slog.Logger

	// mu guards active and stopping, and is held across a claim or a cancel
	// and its transaction so the two never disagree about a run.
	mu       sync.Mutex
	active   map[string]*activeRun // run id → a run this process is running
	stopping bool
	runs     sync.WaitGroup
	warming  atomic.Bool // Run keeps warm pools (warm.go)

	wakeDispatch chan struct{}
	wakeDeliver  chan struct{}

	countsMu sync.Mutex // serializes publishCounts
	connMu   sync.Mutex // guards conn and props; taken last
	conn     *dbus.Conn
	props    *properties
}

type activeRun struct {
	agent  string
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// New opens <stateDir>/scheduler.db. Call Close when done.
func New(cfg *config.Config, stateDir string, opts Options) (*Service, error) {
	if cfg == nil {
		return nil, errors.New("cannot create scheduler: no configuration")
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	st, err := openStore(filepath.Join(stateDir, DBName))
	if err != nil {
		return nil, fmt.Errorf("cannot create scheduler: %w", err)
	}
	s := &Service{
		opts:         opts,
		stateDir:     stateDir,
		store:        st,
		log:          opts.Logger,
		active:       make(map[string]*activeRun),
		wakeDispatch: make(chan struct{}, 1),
		wakeDeliver:  make(chan struct{}, 1),
	}
	s.cfg.Store(cfg)
	return s, nil
}

// Reload swaps the configuration. Queued runs stay queued; running runs
// finish with the configuration they started with.
func (s *Service) Reload(cfg *config.Config) {
	if cfg == nil {
		return
	}
	s.cfg.Store(cfg)
	if s.warming.Load() {
		s.warmPools()
	}
	wake(s.wakeDispatch)
}

// Close closes scheduler.db. Call it after Run has returned.
func (s *Service) Close() error {
	if err := s.store.close(); err != nil {
		return fmt.Errorf("cannot close %s: %w", DBName, err)
	}
	return nil
}

// Run reconciles what an earlier process left behind, then dispatches runs
// and delivers replies until ctx is done. On stop it cancels the running runs
// and puts them back in the queue, waits for them, and returns.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = false
	s.mu.Unlock()
	if err := s.reconcile(ctx); err != nil {
		return fmt.Errorf("cannot reconcile runs: %w", err)
	}
	s.sweepOrphans(ctx)
	s.warming.Store(true)
	s.warmPools()
	var deliveries sync.WaitGroup
	deliveries.Go(func() { s.deliverLoop(ctx) })
	s.publishCounts()
	for {
		s.dispatch()
		select {
		case <-s.wakeDispatch:
		case <-ctx.Done():
			s.mu.Lock()
			s.stopping = true
			for _, a := range s.active {
				a.cancel(errShutdown)
			}
			s.mu.Unlock()
			s.runs.Wait()
			s.warming.Store(false)
			s.drainPools()
			deliveries.Wait()
			s.publishCounts()
			return nil
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Submit queues msg (keys of dev.berth.Scheduler1.Submit) and returns its run
// id once the run is committed. The same message id returns the same run.
func (s *Service) Submit(msg map[string]string) (string, error) {
	id, agent := msg["id"], msg["agent"]
	if id == "" {
		return "", fmt.Errorf("%w: message has no id", ErrInvalidArgument)
	}
	if agent == "" {
		return "", fmt.Errorf("%w: message has no agent", ErrInvalidArgument)
	}
	cfg := s.cfg.Load()
	known := cfg.AgentIDs()
	now := time.Now()
	var r Run
	created := false
	err := s.store.db.Update(func(tx *bolt.Tx) error {
		// The idempotency lookup comes first: a retried Submit of a message
		// that was taken gets its run id even if the agent has since been
		// removed from the config.
		if existing := messagesBucket(tx).Get([]byte(id)); existing != nil {
			r.ID = string(existing)
			return nil
		}
		if !slices.Contains(known, agent) {
			return fmt.Errorf("%w: unknown agent %q (configured agents: %s)", ErrInvalidArgument, agent, strings.Join(known, ", "))
		}
		seq, err := queueBucket(tx).NextSequence()
		if err != nil {
			return fmt.Errorf("cannot number run: %w", err)
		}
		r = Run{
			ID:          newRunID(now),
			MessageID:   id,
			Agent:       agent,
			Connector:   msg["connector"],
			Channel:     msg["channel"],
			ChannelName: msg["channel_name"],
			Thread:      msg["thread"],
			Author:      msg["author"],
			Text:        msg["text"],
			State:       StateQueued,
			CreatedAt:   now,
			Seq:         seq,
		}
		if err := putRun(tx, r); err != nil {
			return err
		}
		created = true
		return messagesBucket(tx).Put([]byte(id), []byte(r.ID))
	})
	if errors.Is(err, ErrInvalidArgument) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("cannot store run: %w", err)
	}
	if created {
		s.log.Info("run queued", "run", r.ID, "agent", agent, "message", id, "connector", r.Connector)
		s.emitStateChanged(r)
		s.publishCounts()
		wake(s.wakeDispatch)
	}
	return r.ID, nil
}

// GetRun returns one run.
func (s *Service) GetRun(id string) (Run, error) {
	var r Run
	err := s.store.db.View(func(tx *bolt.Tx) error {
		var ok bool
		var err error
		r, ok, err = getRun(tx, id)
		if err == nil && !ok {
			err = fmt.Errorf("%w: no run %q", ErrNotFound, id)
		}
		return err
	})
	return r, err
}

// RunFilter selects runs for ListRuns; empty fields match everything.
type RunFilter struct {
	State string
	Agent string
	Limit int // 0 means 50
}

// ListRuns returns the runs matching f, newest first.
func (s *Service) ListRuns(f RunFilter) ([]Run, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	var out []Run
	err := s.store.db.View(func(tx *bolt.Tx) error {
		c := runsBucket(tx).Cursor()
		for k, v := c.Last(); k != nil && len(out) < f.Limit; k, v = c.Prev() {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("cannot decode run %s: %w", k, err)
			}
			if (f.State == "" || r.State == f.State) && (f.Agent == "" || r.Agent == f.Agent) {
				out = append(out, r)
			}
		}
		return nil
	})
	return out, err
}

// CancelRun ends a queued or running run with state canceled. A running run's
// sandbox is killed by its backend; CancelRun returns once it has ended.
func (s *Service) CancelRun(id string) error {
	s.mu.Lock()
	if a, ok := s.active[id]; ok {
		a.cancel(errCanceledByUser)
		s.mu.Unlock()
		<-a.done
		r, err := s.GetRun(id)
		if err != nil {
			return err
		}
		if r.State != StateCanceled {
			return fmt.Errorf("%w: run %s already %s", ErrInvalidArgument, id, r.State)
		}
		return nil
	}
	r, err := s.cancelInactive(id)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.log.Info("run canceled", "run", id, "agent", r.Agent)
	s.emitFinished(r)
	s.publishCounts()
	wake(s.wakeDeliver)
	return nil
}

// cancelInactive cancels a run no goroutine of this process runs; s.mu is held.
func (s *Service) cancelInactive(id string) (Run, error) {
	r, err := s.GetRun(id)
	if err != nil {
		return Run{}, err
	}
	if Finished(r.State) {
		return Run{}, fmt.Errorf("%w: run %s already %s", ErrInvalidArgument, id, r.State)
	}
	if r.State == StateRunning {
		// Left running by an earlier process and not reconciled yet.
		s.killOrphan(context.Background(), r)
	}
	err = s.store.db.Update(func(tx *bolt.Tx) error {
		cur, ok, err := getRun(tx, id)
		if err != nil {
			return err
		}
		if !ok || Finished(cur.State) {
			return fmt.Errorf("%w: run %s changed while being canceled", ErrInvalidArgument, id)
		}
		finish(&cur, StateCanceled, isolation.ReasonCanceled, "canceled before it finished")
		r = cur
		return putRun(tx, cur)
	})
	return r, err
}

// finish moves r to a final state. Runs nobody is waiting for (no connector,
// e.g. `berthctl send`) count as delivered.
func finish(r *Run, state, reason, errText string) {
	r.State = state
	r.Reason = reason
	r.Error = errText
	r.FinishedAt = time.Now()
	r.Delivered = r.Connector == ""
}

// killOrphan kills the sandbox an earlier process left behind for r.
func (s *Service) killOrphan(ctx context.Context, r Run) {
	if r.Handle == "" {
		return
	}
	b := s.opts.Backends[r.Backend]
	if b == nil {
		s.log.Warn("cannot kill sandbox of interrupted run: backend not available",
			"run", r.ID, "backend", r.Backend, "handle", r.Handle)
		return
	}
	if err := b.Kill(ctx, r.Handle); err != nil {
		s.log.Warn("cannot kill sandbox of interrupted run", "run", r.ID, "handle", r.Handle, "err", err)
	}
}

// reconcile handles runs an earlier process left running: their sandboxes are
// killed and they are queued again at the front of their agent's line (they
// keep their seq), unless this was their second start.
func (s *Service) reconcile(ctx context.Context) error {
	var orphans []Run
	err := s.store.db.View(func(tx *bolt.Tx) error {
		return runsBucket(tx).ForEach(func(k, v []byte) error {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("cannot decode run %s: %w", k, err)
			}
			if r.State == StateRunning {
				orphans = append(orphans, r)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var changed []Run
	for _, r := range orphans {
		if _, mine := s.active[r.ID]; mine {
			continue
		}
		s.killOrphan(ctx, r)
		err := s.store.db.Update(func(tx *bolt.Tx) error {
			cur, ok, err := getRun(tx, r.ID)
			if err != nil || !ok || cur.State != StateRunning {
				return err
			}
			if cur.Attempts < 2 {
				cur.State = StateQueued
				cur.Handle = ""
			} else {
				finish(&cur, StateFailed, ReasonInterruptedTwice,
					fmt.Sprintf("the scheduler stopped during each of the %d attempts", cur.Attempts))
			}
			r = cur
			return putRun(tx, cur)
		})
		if err != nil {
			return err
		}
		s.log.Warn("run was interrupted by a scheduler restart", "run", r.ID, "agent", r.Agent, "attempts", r.Attempts, "state", r.State)
		changed = append(changed, r)
	}
	for _, r := range changed {
		if r.State == StateQueued {
			s.emitStateChanged(r)
		} else {
			s.emitFinished(r)
		}
	}
	return nil
}

// errorText is the user-facing text of a failed or canceled run.
func replyText(r Run) string {
	switch r.State {
	case StateCanceled:
		return "This request was canceled before it finished."
	case StateFailed:
		return fmt.Sprintf("Sorry, this request failed: %s.", r.Reason)
	}
	return r.Reply
}

// trimTail keeps the last n bytes of s.
func trimTail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
