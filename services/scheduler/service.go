package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runprep"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/isolation"
)

// Errors callers can tell apart (errors.Is); the D-Bus object maps them to
// dev.berth.Error.NotFound and dev.berth.Error.InvalidArgument.
var (
	ErrNotFound        = errors.New("not found")
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotApprover: the person is not one of the agent's [[approvers]].
	ErrNotApprover = errors.New("not an approver")
)

// Cancel causes of a run's context: a user's CancelRun ends the run, a
// graceful stop hands it back to the queue.
var (
	errCanceledByUser = errors.New("canceled by CancelRun")
	errShutdown       = errors.New("scheduler is stopping")
)

// Loop timing.
const (
	// progressInterval is the longest the dispatcher waits between passes
	// when idle; LastProgress never lags more than this behind a healthy loop.
	progressInterval = 5 * time.Second
	// killTimeout bounds each Backend.Kill: an engine that never answers must
	// not hold a CancelRun or a start forever.
	killTimeout = 30 * time.Second
	// cancelWait bounds how long CancelRun waits for a running run to end.
	cancelWait = 2 * time.Minute
)

// Options are the scheduler's side effects and seams.
type Options struct {
	// Backends maps an agent's Isolation ("landlock", "unrestricted",
	// "container") to the backend that runs it.
	Backends map[string]isolation.Backend
	// ForceUnrestricted runs every landlock agent on the "unrestricted"
	// backend, with no sandbox (berth-scheduler --unrestricted): their plans
	// are compiled so, and say why.
	ForceUnrestricted bool
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
	// Images gives container runs their isolation image (berth-imaged).
	// Nil: the container backend builds the default agent image itself,
	// for tests and hosts without the image service.
	Images runprep.ImageEnsurer
	// Clock is the time of everything the scheduler times: run records,
	// retries, retention, the dispatcher's pace. Nil means the real clock.
	Clock clockwork.Clock
	// Hold, when set, is called at the points of a start named Hold* and
	// may block until ctx (the run's) ends: crash tests kill the scheduler
	// there (HoldAtFiles). Nil in production.
	Hold func(ctx context.Context, point, runID string, attempt int)
	// Resolver resolves names for `berthctl egress explain`, as the egress
	// proxy does when the request is sent; nil means the system's.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// ScheduleTimers keeps the time of [[schedules]] under systemd
	// (schedules.SystemdTimers); nil: the scheduler keeps it on Clock.
	ScheduleTimers schedules.Timers
	// quotaRefusal is runprep.Options.QuotaRefusal, for tests.
	quotaRefusal error
	// noScheduleCatchUp turns the catch-up of missed jobs off: the tests'
	// control.
	noScheduleCatchUp bool
	// noScheduleFollow makes a restarted scheduler not wait for the run a
	// job's firing left going: the tests' control that overlap holds
	// across a restart only because it does.
	noScheduleFollow bool
}

// Service is berth-scheduler: the store, the dispatcher, the deliveries and
// the D-Bus object.
type Service struct {
	opts     Options
	stateDir string
	store    *store
	cfg      atomic.Pointer[config.Config]
	// prep readies each run for its backend (internal/runprep); the
	// Backends, Images, Getenv and ConfigDir options are its.
	prep  *runprep.Preparer
	log   *slog.Logger
	clock clockwork.Clock

	// mu guards active and stopping only: it is never held across a
	// transaction, a backend call or a bus call.
	mu       sync.Mutex
	active   map[string]*activeRun // run id → a run this process is running
	stopping bool
	// sandboxes are the conversations' kept sandboxes (sandboxes.go).
	sandboxes *sandboxes
	runs      sync.WaitGroup
	warming   atomic.Bool // Run keeps warm pools (warm.go)

	lastProgress atomic.Int64      // unix nanoseconds of the dispatcher's last pass
	failed       chan error        // the first store failure of a running Run
	passed       func()            // tests: called after each dispatcher pass
	retained     chan retainReport // tests: each retention pass's outcome
	// abandonSandboxes (tests) makes Run's stop leave the sandboxes alive,
	// as a crash does.
	abandonSandboxes atomic.Bool

	// queue is the dispatcher's memory of queue/ (queueview.go); only Run's
	// goroutine and the writes it waits for use it.
	queue queueView

	// scheduled fires the [[schedules]] jobs (schedules.go).
	scheduled scheduled
	// approvals are the pending asks of running runs (approvals.go).
	approvals approvals

	wakeDispatch chan struct{}
	wakeWarm     chan struct{} // refill the warm pools (warm.go)
	wakeDeliver  chan struct{}

	countsGen atomic.Uint64 // orders publishCounts calls (dbus.go)
	connMu    sync.Mutex    // guards conn and props; taken last
	conn      *dbus.Conn
	props     *properties

	metrics *schedulerMetrics // metrics.go

	// spends are the live egress proxies that get allowances (usage.go).
	spends spendBook
}

type activeRun struct {
	agent string
	// parallel: the run is in its conversation's sandbox, so its agent may
	// run others meanwhile.
	parallel bool
	attempt  int             // Run.Attempt of the start this process runs
	ctx      context.Context // the run's; canceled with errShutdown or errCanceledByUser
	cancel   context.CancelCauseFunc
	done     chan struct{}
}

// New opens <stateDir>/scheduler.db. Call Close when done.
func New(cfg *config.Config, stateDir string, opts Options) (*Service, error) {
	if cfg == nil {
		return nil, errors.New("cannot create scheduler: no configuration")
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	st, err := openStore(filepath.Join(stateDir, DBName))
	if err != nil {
		return nil, fmt.Errorf("cannot create scheduler: %w", err)
	}
	// The committer logs a full disk (once a minute while it lasts) and its end.
	st.w.SetLogger(opts.Logger.With("db", DBName))
	s := &Service{
		opts:     opts,
		stateDir: stateDir,
		store:    st,
		prep: runprep.New(runprep.Options{
			StateDir:          stateDir,
			Backends:          opts.Backends,
			ForceUnrestricted: opts.ForceUnrestricted,
			ConfigDir:         opts.ConfigDir,
			Getenv:            opts.Getenv,
			Images:            opts.Images,
			UIDs:              uidStore{st},
			Logger:            opts.Logger,
			QuotaRefusal:      opts.quotaRefusal,
		}),
		log:          opts.Logger,
		clock:        opts.Clock,
		active:       make(map[string]*activeRun),
		sandboxes:    newSandboxes(),
		failed:       make(chan error, 1),
		wakeDispatch: make(chan struct{}, 1),
		wakeWarm:     make(chan struct{}, 1),
		wakeDeliver:  make(chan struct{}, 1),
	}
	s.cfg.Store(cfg)
	s.setRunsCPUWeight(cfg)
	s.metrics = newSchedulerMetrics(s)
	s.markProgress()
	if err := s.startSchedules(cfg); err != nil {
		st.close()
		return nil, fmt.Errorf("cannot create scheduler: %w", err)
	}
	return s, nil
}

// Reload swaps the configuration. Queued runs stay queued; running runs
// finish with the configuration they started with.
func (s *Service) Reload(cfg *config.Config) {
	if cfg == nil {
		return
	}
	s.cfg.Store(cfg)
	s.setRunsCPUWeight(cfg)
	s.setSchedules(cfg)
	if s.warming.Load() {
		wake(s.wakeWarm)
	}
	wake(s.wakeDispatch)
}

// setRunsCPUWeight gives all host runs together [scheduler]
// runs_cpu_weight (ADR 30); the next run writes it to their group.
// A Config not made by config.Load (0) has the default.
func (s *Service) setRunsCPUWeight(cfg *config.Config) {
	w := cfg.Scheduler.RunsCPUWeight
	if w == 0 {
		w = config.DefaultRunsCPUWeight
	}
	if err := runprep.SetRunsCPUWeight(w); err != nil {
		s.log.Warn("runs keep their CPU weight", "err", err)
	}
}

// Close closes scheduler.db. Call it after Run has returned.
func (s *Service) Close() error {
	s.closeSchedules()
	// Without systemd the scheduler mounted its agents' workspace images
	// itself; under systemd they are units and stay.
	if err := s.prep.ReleaseWorkspaces(); err != nil {
		s.log.Warn("cannot unmount workspace images", "err", err)
	}
	if err := s.store.close(); err != nil {
		return fmt.Errorf("cannot close %s: %w", DBName, err)
	}
	return nil
}

// LastProgress is when the dispatcher last completed a pass. A healthy
// dispatcher passes at least every 5 seconds, idle or not, so a daemon pings
// its watchdog only while LastProgress is recent.
func (s *Service) LastProgress() time.Time {
	return time.Unix(0, s.lastProgress.Load())
}

func (s *Service) markProgress() { s.lastProgress.Store(s.clock.Now().UnixNano()) }

// fail reports a store failure that ends Run (the first one wins).
func (s *Service) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

// Run reconciles what an earlier process left behind, then dispatches runs,
// delivers replies and prunes old records until ctx is done. On stop it
// cancels the running runs and puts them back in the queue, waits for them,
// and returns nil. When its work cannot go on (the store fails), it stops
// the same way and returns the reason: the daemon must exit, not go on
// answering as if it were working.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = false
	s.mu.Unlock()
	select { // a failure of an earlier Run is not this one's
	case <-s.failed:
	default:
	}
	if err := s.removeRecordedSandboxes(ctx); err != nil {
		return fmt.Errorf("cannot reconcile runs: %w", err)
	}
	if err := s.reconcileWhenThereIsRoom(ctx); err != nil {
		return fmt.Errorf("cannot reconcile runs: %w", err)
	}
	// No proxy of this process holds what an earlier one left pending: its
	// runs are re-queued and ask again.
	if err := s.closeOrphanedApprovals(); err != nil {
		s.log.Warn("cannot close the approvals an earlier scheduler left pending", "err", err)
	}
	s.queue.reset() // reconcile and an earlier stop put runs back under old keys
	s.markProgress()
	s.warming.Store(true)
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	// Pools are (re)filled by one goroutine of their own: asking berth-imaged
	// for an image may wait for a build, which must delay no dispatch.
	var warmer sync.WaitGroup
	warmer.Go(func() { s.warmLoop(loopCtx) })
	wake(s.wakeWarm)
	var loops sync.WaitGroup
	loops.Go(func() {
		if err := s.deliverLoop(loopCtx); err != nil {
			s.fail(err)
		}
	})
	loops.Go(func() { s.retentionLoop(loopCtx) })
	loops.Go(func() { s.sweepLoop(loopCtx) })
	loops.Go(func() { s.reapLoop(loopCtx) })
	s.publishCounts()
	ticker := s.clock.NewTicker(progressInterval)
	defer ticker.Stop()
	var runErr error
loop:
	for {
		if err := s.dispatch(); err != nil {
			runErr = fmt.Errorf("cannot dispatch runs: %w", err)
			break
		}
		s.markProgress()
		if s.passed != nil {
			s.passed()
		}
		select {
		case <-s.wakeDispatch:
		case <-ticker.Chan():
		case err := <-s.failed:
			runErr = err
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	if runErr != nil {
		s.log.Error("the scheduler cannot go on; stopping", "err", runErr)
	}
	stopLoops()
	s.mu.Lock()
	s.stopping = true
	for _, a := range s.active {
		a.cancel(errShutdown)
	}
	s.mu.Unlock()
	s.runs.Wait()
	if !s.abandonSandboxes.Load() {
		s.stopAllSandboxes()
	}
	s.warming.Store(false)
	warmer.Wait() // no pool is filled after this drain
	s.drainPools()
	loops.Wait()
	s.publishCounts()
	return runErr
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Submit queues msg and returns its run id once the run is committed. The
// same message (its Key: connector and message id) returns the same run,
// also when both Submits share one commit. Submits that arrive while a
// commit is under way share the next one (store.write); their runs are
// numbered, and so queued, in the order the committer takes them. Texts are
// stored made valid (cleanText), so that whatever the run gives back can
// cross D-Bus.
func (s *Service) Submit(msg busapi.Submission) (string, error) {
	// Refused before it costs the group commit a write.
	if err := checkMessage(msg); err != nil {
		return "", err
	}
	known := s.cfg.Load().AgentIDs()
	var (
		r       Run
		created bool
		refused error
	)
	// Called again when the group is applied a second time: every result is
	// set afresh.
	err := s.store.write(func(tx *bolt.Tx) error {
		var err error
		r, created, refused, err = s.queueMessage(tx, msg, known)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("cannot store run: %w", err)
	}
	if refused != nil {
		return "", refused
	}
	if created {
		s.runLog(r).Info("run queued", "message_id", r.MessageID, "connector", r.Connector)
		s.emitStateChanged(r)
		s.publishCounts()
		wake(s.wakeDispatch)
	}
	return r.ID, nil
}

// GetRun returns one run. A run whose record cannot be decoded is
// quarantined and reported as not found.
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
	if c, bad := asCorrupt(err); bad {
		s.setAside(c)
		return Run{}, fmt.Errorf("%w: run %q could not be read and was quarantined", ErrNotFound, id)
	}
	return r, err
}

// setAside moves undecodable records to quarantine/ and says so in the log;
// the scheduler goes on without them.
func (s *Service) setAside(bad ...*corruptRecord) {
	if len(bad) == 0 {
		return
	}
	now := s.clock.Now()
	err := s.store.update(func(tx *bolt.Tx) error {
		for _, c := range bad {
			if err := quarantineRecord(tx, c.bucket, c.key, c.Error(), now); err != nil {
				return err
			}
		}
		return nil
	})
	for _, c := range bad {
		attrs := []any{"bucket", string(c.bucket), "key", string(c.key), "err", c.err}
		if bytes.Equal(c.bucket, bucketRuns) || bytes.Equal(c.bucket, bucketSummaries) {
			attrs = append(attrs, "run_id", string(c.key))
		}
		if err != nil {
			s.log.Error("cannot quarantine an undecodable record", append(attrs, "quarantine_err", err)...)
		} else {
			s.log.Error("quarantined an undecodable record; see berthctl status", attrs...)
		}
	}
	s.publishCounts()
}

// RunFilter selects runs for ListRuns; empty fields match everything.
type RunFilter struct {
	State  string
	Agent  string
	Limit  int    // 0 means 50; at most 500
	Before string // a run id: only runs older than it (the next page)
	// Schedule is the [[schedules]] job whose firings are listed.
	Schedule string
}

// List bounds.
const (
	defaultListLimit = 50
	maxListLimit     = 500
)

// ListRuns returns the summaries of the runs matching f, newest first. It
// reads the state index when f has a state, the agent index when it has
// only an agent, and never a full run record; a schedule filters the
// summaries so read.
func (s *Service) ListRuns(f RunFilter) ([]Summary, error) {
	if f.Limit <= 0 {
		f.Limit = defaultListLimit
	}
	if f.Limit > maxListLimit {
		return nil, fmt.Errorf("%w: limit %d is above %d", ErrInvalidArgument, f.Limit, maxListLimit)
	}
	if f.State != "" && !slices.Contains(states, f.State) {
		return nil, fmt.Errorf("%w: unknown state %q (known: %s)", ErrInvalidArgument, f.State, strings.Join(states, ", "))
	}
	// A broken summary is set aside (and rebuilt from its run when that is
	// sound), then the page is read again, once.
	for attempt := 0; ; attempt++ {
		out, bad, err := s.listOnce(f)
		s.setAside(bad...)
		if err != nil {
			return nil, fmt.Errorf("cannot list runs: %w", err)
		}
		if len(bad) == 0 || attempt == 1 {
			return out, nil
		}
	}
}

func (s *Service) listOnce(f RunFilter) ([]Summary, []*corruptRecord, error) {
	var out []Summary
	var bad []*corruptRecord
	err := s.store.db.View(func(tx *bolt.Tx) error {
		out, bad = out[:0], bad[:0]
		var c *bolt.Cursor
		var prefix []byte
		switch {
		case f.State != "":
			c, prefix = byStateBucket(tx).Cursor(), indexKey(f.State, "")
		case f.Agent != "":
			c, prefix = byAgentBucket(tx).Cursor(), indexKey(f.Agent, "")
		default:
			c = summariesBucket(tx).Cursor()
		}
		for k := newestBefore(c, prefix, f.Before); k != nil && bytes.HasPrefix(k, prefix) && len(out) < f.Limit; k, _ = c.Prev() {
			sum, ok, err := getSummary(tx, k[len(prefix):])
			if cr, isBad := asCorrupt(err); isBad {
				bad = append(bad, cr)
				continue
			}
			if err != nil {
				return err
			}
			if !ok || (f.State != "" && sum.State != f.State) || (f.Agent != "" && sum.Agent != f.Agent) || (f.Schedule != "" && sum.Schedule != f.Schedule) {
				continue
			}
			out = append(out, sum)
		}
		return nil
	})
	return out, bad, err
}

// newestBefore positions c on the last key with prefix that sorts before
// prefix+before (the last key with prefix when before is "").
func newestBefore(c *bolt.Cursor, prefix []byte, before string) []byte {
	var k []byte
	if before != "" {
		k, _ = c.Seek(append(bytes.Clone(prefix), before...))
	} else if len(prefix) > 0 {
		// 0xFF sorts after every id character.
		k, _ = c.Seek(append(bytes.Clone(prefix), 0xFF))
	} else {
		k, _ = c.Last()
		return k
	}
	if k == nil {
		k, _ = c.Last()
		return k
	}
	k, _ = c.Prev()
	return k
}

// CancelRun ends a queued or running run with state canceled. A running run's
// sandbox is killed by its backend; CancelRun returns once it has ended.
func (s *Service) CancelRun(id string) error {
	killed := false
	for range 4 {
		if a := s.activeRun(id); a != nil {
			a.cancel(errCanceledByUser)
			select {
			case <-a.done:
			case <-s.clock.After(cancelWait):
				return fmt.Errorf("run %s did not stop within %s of being canceled", id, cancelWait)
			}
			r, err := s.GetRun(id)
			if err != nil {
				return err
			}
			if r.State != StateCanceled {
				return fmt.Errorf("%w: run %s already %s", ErrInvalidArgument, id, r.State)
			}
			return nil
		}
		r, err := s.cancelInactive(id, killed)
		var orphan *needsKill
		switch {
		case errors.Is(err, errBecameActive):
			continue
		case errors.As(err, &orphan):
			// Left running by an earlier process and not reconciled yet.
			s.killOrphan(context.Background(), orphan.run)
			killed = true
			continue
		case err != nil:
			return err
		}
		s.log.Info("run canceled", "run_id", id, "agent", r.Agent)
		s.emitFinished(r)
		s.publishCounts()
		wake(s.wakeDeliver)
		return nil
	}
	return fmt.Errorf("run %s changed state too often while being canceled; try again", id)
}

// activeRun is the run this process runs as id, or nil.
func (s *Service) activeRun(id string) *activeRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active[id]
}

var errBecameActive = errors.New("run was started while being canceled")

// needsKill says a run must have its sandbox killed before it is canceled.
type needsKill struct{ run Run }

func (e *needsKill) Error() string { return "run " + e.run.ID + " has a sandbox to kill first" }

// cancelInactive cancels a run no goroutine of this process runs, in one
// transaction; killed says its orphaned sandbox was killed already.
func (s *Service) cancelInactive(id string, killed bool) (Run, error) {
	var r Run
	var refused error // the answer when nothing is written
	err := s.store.write(func(tx *bolt.Tx) error {
		r, refused = Run{}, nil
		cur, ok, err := getRun(tx, id)
		switch {
		case err != nil:
			refused = err
		case !ok:
			refused = fmt.Errorf("%w: no run %q", ErrNotFound, id)
		case Finished(cur.State):
			refused = fmt.Errorf("%w: run %s already %s", ErrInvalidArgument, id, cur.State)
		case cur.State == StateRunning && s.activeRun(id) != nil:
			refused = errBecameActive
		case cur.State == StateRunning && !killed && cur.Handle != "":
			refused = &needsKill{run: cur}
		}
		if refused != nil {
			return nil
		}
		finish(&cur, StateCanceled, isolation.ReasonCanceled, "canceled before it finished", s.clock.Now())
		r = cur
		return putRun(tx, cur)
	})
	if err == nil {
		err = refused
	}
	if c, bad := asCorrupt(err); bad {
		s.setAside(c)
		return Run{}, fmt.Errorf("%w: run %q could not be read and was quarantined", ErrNotFound, id)
	}
	return r, err
}

// finish moves r to a final state. Runs nobody is waiting for (no connector,
// e.g. `berthctl send`) count as delivered.
func finish(r *Run, state, reason, errText string, now time.Time) {
	r.State = state
	r.Reason = cleanText(reason)
	r.Error = cleanText(errText)
	r.FinishedAt = now
	r.Delivered = r.Connector == ""
}

// killOrphan kills the sandbox an earlier process left behind for r, giving
// the backend killTimeout.
func (s *Service) killOrphan(ctx context.Context, r Run) {
	if r.Handle == "" {
		return
	}
	b := s.opts.Backends[r.Backend]
	if b == nil {
		s.log.Warn("cannot kill sandbox of interrupted run: backend not available",
			"run_id", r.ID, "agent", r.Agent, "backend", r.Backend, "handle", r.Handle)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	if err := b.Kill(ctx, r.Handle); err != nil {
		s.log.Warn("cannot kill sandbox of interrupted run", "run_id", r.ID, "agent", r.Agent, "backend", r.Backend, "handle", r.Handle, "err", err)
	}
}

// reconcile handles runs an earlier process left running: their sandboxes are
// killed and they are queued again at the front of their agent's line (they
// keep their seq), unless this was their second start. It reads only the
// runs the state index lists as running.
func (s *Service) reconcile(ctx context.Context) error {
	var orphans []Run
	var bad []*corruptRecord
	err := s.store.db.View(func(tx *bolt.Tx) error {
		orphans, bad = orphans[:0], bad[:0]
		for _, id := range runIDsInState(tx, StateRunning) {
			r, ok, err := getRun(tx, id)
			if c, isBad := asCorrupt(err); isBad {
				bad = append(bad, c)
				continue
			}
			if err != nil {
				return err
			}
			if ok && r.State == StateRunning {
				orphans = append(orphans, r)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.setAside(bad...)
	var changed []Run
	for _, r := range orphans {
		if s.activeRun(r.ID) != nil {
			continue
		}
		s.killOrphan(ctx, r)
		now := s.clock.Now()
		err := s.store.update(func(tx *bolt.Tx) error {
			cur, ok, err := getRun(tx, r.ID)
			if err != nil || !ok || cur.State != StateRunning {
				return err
			}
			if cur.Attempts < 2 {
				cur.State = StateQueued
				cur.Handle = ""
			} else {
				finish(&cur, StateFailed, isolation.ReasonInterruptedTwice,
					fmt.Sprintf("the scheduler stopped during each of the %d attempts", cur.Attempts), now)
			}
			r = cur
			return putRun(tx, cur)
		})
		if c, isBad := asCorrupt(err); isBad {
			s.setAside(c)
			continue
		}
		if err != nil {
			return err
		}
		s.log.Warn("run was interrupted by a scheduler restart", "run_id", r.ID, "agent", r.Agent, "attempts", r.Attempts, "state", r.State)
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

// reconcileWhenThereIsRoom reconciles, waiting out a full state disk: a
// scheduler that starts on one keeps its interrupted runs as they are and
// tries again (with back-off, up to 5 s apart) instead of exiting, so it
// resumes by itself once there is room. It counts as progress meanwhile
// (the watchdog): it is doing what it can.
func (s *Service) reconcileWhenThereIsRoom(ctx context.Context) error {
	retryDelay := backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := s.reconcile(ctx)
		if err == nil || !boltstore.IsDiskFull(err) {
			return err
		}
		wait := retryDelay.Delay(attempt)
		s.log.Warn("cannot reconcile the runs an earlier scheduler left running: the state disk is full; trying again", "err", err, "retry_in", wait)
		s.markProgress()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clock.After(wait):
		}
	}
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
