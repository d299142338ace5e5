package schedules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Options are a Table's seams.
type Options struct {
	// Fire starts the job's run and returns when the run has ended; its
	// error is the firing's failure. The run's own limits (MaxRuntime)
	// bound it: while it runs, the job's next firings skip or wait.
	Fire func(ctx context.Context, job Job) error
	// Timers keeps the time under systemd (SystemdTimers); nil: the Table
	// keeps it itself on Clock.
	Timers Timers
	// Clock is the time of firings and listings (default the real clock);
	// the scheduler passes its own.
	Clock clockwork.Clock
	// Store keeps each job's last firing across restarts (the scheduler's
	// scheduler.db); nil keeps it in memory only.
	Store Store
	// CatchUp fires, once, a job whose calendar elapsed while no Table
	// kept its time: at the first Set, for each job whose Store record
	// says when its time was last kept (Persistent=true, as systemd's
	// timers do). It needs Store, and it is for the Table that keeps the
	// time itself: under systemd (Timers) the timer catches up, and
	// CatchUp is ignored.
	CatchUp bool
	// Follow waits until run runID ends, returning its failure like Fire.
	// At the first Set, a job whose Store record says its last firing's
	// run was still going when the last Table stopped counts as running
	// until Follow returns, so that a restart cannot start a second run of
	// it beside the first. Nil: such a run is not waited for.
	Follow func(ctx context.Context, runID string) error
	Logger *slog.Logger
}

// Store keeps one Record per job. The Table calls it without holding its
// own lock, from the goroutine that decided the change.
type Store interface {
	// Records is every job's record, by id.
	Records() (map[string]Record, error)
	// Update changes one job's record (a zero Record when it has none) in
	// one transaction; fn may be called more than once.
	Update(id string, fn func(*Record)) error
	// Keep removes the records of every job not in ids.
	Keep(ids []string) error
}

// Record is what a Store keeps of a job: its last firing, and until when
// the Table kept its time.
type Record struct {
	LastStart  time.Time `json:"last_start,omitzero"`
	LastEnd    time.Time `json:"last_end,omitzero"`
	LastState  State     `json:"last_state,omitempty"`
	LastDetail string    `json:"last_detail,omitempty"`
	// RunID is the last firing's run; the scheduler writes it in the
	// transaction that queues the run, and the run's end in the one that
	// finishes it.
	RunID string `json:"run_id,omitempty"`
	// Checked is when the Table last decided the job's due firings (or
	// first had the job): every elapse up to it was fired or skipped.
	Checked time.Time `json:"checked,omitzero"`
}

// Timers is what keeps time for the Table when it does not: something
// that, told the jobs, calls Table.Trigger at their calendar's elapses.
type Timers interface {
	Reconcile(ctx context.Context, jobs []Job) error
}

// Cause says why a job fires.
type Cause int

const (
	// Scheduled is an elapse of the job's calendar; it keeps to the job's
	// active hours.
	Scheduled Cause = iota
	// Manual is an admin's `schedules run`: the hours do not apply, the
	// overlap rule does.
	Manual
)

// Outcome is what Trigger did with a firing.
type Outcome string

const (
	Started Outcome = "started"
	Queued  Outcome = "queued"  // it runs when the running firing ends (overlap = "wait")
	Skipped Outcome = "skipped" // see the journal line and the job's LastState
)

// State is a job's last firing's outcome.
type State string

const (
	StateNever     State = ""
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateSkipped   State = "skipped"
)

// Status is one job's line in a listing.
type Status struct {
	ID        string
	Next      time.Time // zero: never again
	LastStart time.Time // of the last firing that ran
	LastEnd   time.Time
	LastState State
	// LastDetail says why the last firing failed or was skipped.
	LastDetail string
	// RunID is the last firing's run, when the Store knows it.
	RunID   string
	Running bool
}

// Table holds the jobs, fires them and remembers how each firing went.
type Table struct {
	opts  Options
	clock clockwork.Clock
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup // loops and firings

	mu     sync.Mutex
	jobs   map[string]*entry
	loaded bool // the first Set read the Store's records
}

type entry struct {
	compiled
	stopLoop context.CancelFunc // nil under systemd
	running  bool
	pending  bool // a firing waits for the running one (overlap = "wait")
	status   Status
}

// New makes an empty Table; Set gives it its jobs.
func New(opts Options) (*Table, error) {
	if opts.Fire == nil {
		return nil, errors.New("cannot make a schedules table: it needs a Fire function")
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Table{opts: opts, clock: opts.Clock, log: opts.Logger, ctx: ctx, stop: stop, jobs: map[string]*entry{}}, nil
}

// Set makes jobs the Table's jobs: new ones are added, changed ones
// replaced, gone ones removed (a firing of a removed job that is running
// ends as its run ends). A job that is wrong, or an id used twice, changes
// nothing. Under systemd the timers are reconciled after the Table changed.
func (t *Table) Set(ctx context.Context, jobs []Job) error {
	next := make(map[string]compiled, len(jobs))
	for _, j := range jobs {
		c, err := compile(j)
		if err != nil {
			return err
		}
		if _, dup := next[j.ID]; dup {
			return fmt.Errorf("cannot use schedule %q: its id is used twice", j.ID)
		}
		next[j.ID] = c
	}
	// The first Set reads the records: a job missed while no Table kept
	// its time fires once (CatchUp).
	t.mu.Lock()
	first := !t.loaded
	t.mu.Unlock()
	var records map[string]Record
	if first && t.opts.Store != nil {
		var err error
		if records, err = t.opts.Store.Records(); err != nil {
			t.log.Error("cannot read the schedules' last firings; a job missed meanwhile is not caught up", "err", err)
		}
	}
	now := t.clock.Now()
	type catchUp struct {
		e          *entry
		c          compiled
		due, since time.Time
	}
	var missed []catchUp
	var fresh []string // jobs whose time is kept from now on
	t.mu.Lock()
	if t.ctx.Err() != nil {
		t.mu.Unlock()
		return errClosed
	}
	t.loaded = true
	for id, e := range t.jobs {
		if c, kept := next[id]; !kept || c.job != e.job {
			if e.stopLoop != nil {
				e.stopLoop()
			}
			if !kept {
				delete(t.jobs, id)
			}
		}
	}
	for id, c := range next {
		e := t.jobs[id]
		if e != nil && e.job == c.job {
			continue
		}
		added := e == nil
		if added {
			e = &entry{status: Status{ID: id}}
			t.jobs[id] = e
		}
		e.compiled = c
		e.stopLoop = nil
		if t.opts.Timers == nil {
			loopCtx, stop := context.WithCancel(t.ctx)
			e.stopLoop = stop
			t.wg.Go(func() { t.loop(loopCtx, e, c) })
		}
		if rec, had := records[id]; added && first && had && rec.LastState == StateRunning && rec.RunID != "" && t.opts.Follow != nil {
			e.running = true
			e.status.LastStart, e.status.LastState, e.status.RunID = rec.LastStart, StateRunning, rec.RunID
			t.followLocked(e, rec)
		}
		if !added || t.opts.Timers != nil || t.opts.Store == nil {
			continue
		}
		rec, had := records[id]
		if !had || rec.Checked.IsZero() {
			fresh = append(fresh, id)
			continue
		}
		if due, ok := c.spec.Next(rec.Checked); first && t.opts.CatchUp && ok && !due.After(now) {
			missed = append(missed, catchUp{e, c, due, rec.Checked})
		}
	}
	t.mu.Unlock()
	if t.opts.Store != nil {
		ids := make([]string, 0, len(next))
		for id := range next {
			ids = append(ids, id)
		}
		if err := t.opts.Store.Keep(ids); err != nil {
			t.log.Error("cannot remove the last firings of removed schedules", "err", err)
		}
		for _, id := range fresh {
			t.save(id, func(r *Record) { r.Checked = now })
		}
	}
	// The loops wait for the next elapse after now: a missed one fires
	// here, once however many elapsed.
	for _, m := range missed {
		t.log.Info("schedule missed while berth-scheduler was not running: it fires once now",
			"schedule", m.c.job.ID, "missed", m.due, "not_running_since", m.since)
		t.trigger(m.e, m.c, Scheduled)
	}
	if t.opts.Timers != nil {
		if err := t.opts.Timers.Reconcile(ctx, jobs); err != nil {
			return fmt.Errorf("cannot set the schedules' timers: %w", err)
		}
	}
	return nil
}

// recheck bounds how long the loop sleeps at once, so a wall clock that
// jumps (a suspended machine, a corrected clock) fires a due job within
// that much instead of when the monotonic timer ends.
const recheck = time.Minute

// loop fires one job at its calendar's elapses, on the Table's clock.
func (t *Table) loop(ctx context.Context, e *entry, c compiled) {
	for {
		due, ok := c.spec.Next(t.clock.Now())
		if !ok {
			t.log.Info("schedule will not fire again: its calendar has no elapse left", "schedule", c.job.ID, "on_calendar", c.spec.String())
			return
		}
		for {
			wait := due.Sub(t.clock.Now())
			if wait <= 0 {
				break
			}
			timer := t.clock.NewTimer(min(wait, recheck))
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.Chan():
			}
		}
		if ctx.Err() != nil { // replaced or removed while it slept
			return
		}
		t.trigger(e, c, Scheduled)
	}
}

// Trigger fires the job now: the systemd timer's FireSchedule call
// (Scheduled) or an admin's (Manual). It returns at once; the run goes on.
func (t *Table) Trigger(id string, cause Cause) (Outcome, error) {
	t.mu.Lock()
	e := t.jobs[id]
	var c compiled
	if e != nil {
		c = e.compiled
	}
	t.mu.Unlock()
	if e == nil {
		return "", fmt.Errorf("cannot fire schedule %q: %w", id, ErrUnknown)
	}
	if t.ctx.Err() != nil {
		return "", errClosed
	}
	return t.trigger(e, c, cause), nil
}

func (t *Table) trigger(e *entry, c compiled, cause Cause) Outcome {
	now := t.clock.Now()
	// A scheduled firing decides every elapse up to now (the Table's
	// loop's; under systemd the timer keeps that).
	checked := cause == Scheduled && t.opts.Timers == nil
	if cause == Scheduled && c.window != nil && !c.window.contains(t.inZone(c, now)) {
		t.skip(e, "it is outside its active hours "+c.job.ActiveHours, now, checked)
		return Skipped
	}
	t.mu.Lock()
	if t.ctx.Err() != nil { // closed: no firing may start once Close waits
		t.mu.Unlock()
		return Skipped
	}
	if e.running {
		if c.job.Overlap == OverlapWait {
			already := e.pending
			e.pending = true
			t.mu.Unlock()
			if !already {
				t.log.Info("schedule waits: its previous firing is still running", "schedule", c.job.ID)
			}
			if checked {
				t.save(c.job.ID, func(r *Record) { r.Checked = now })
			}
			return Queued
		}
		t.mu.Unlock()
		t.skip(e, "its previous firing is still running", now, checked)
		return Skipped
	}
	e.running = true
	t.startLocked(e, now, checked)
	t.mu.Unlock()
	return Started
}

// startLocked runs the entry's current job; t.mu is held. checked says
// the firing decided the job's elapses up to now.
func (t *Table) startLocked(e *entry, now time.Time, checked bool) {
	job := e.job
	e.status.LastStart, e.status.LastEnd = now, time.Time{}
	e.status.LastState, e.status.LastDetail = StateRunning, ""
	t.log.Info("schedule fired", "schedule", job.ID, "agent", job.Agent)
	t.wg.Go(func() {
		// Recorded before the run is: the scheduler adds the run's id in
		// the transaction that queues it.
		t.save(job.ID, func(r *Record) {
			r.LastStart, r.LastEnd, r.LastState, r.LastDetail, r.RunID = now, time.Time{}, StateRunning, "", ""
			if checked {
				r.Checked = now
			}
		})
		err := t.opts.Fire(t.ctx, job)
		end := t.clock.Now()
		// Closing: the run goes on, and its end is recorded with it.
		closing := t.ctx.Err() != nil
		state, detail := StateSucceeded, ""
		if err != nil {
			state, detail = StateFailed, err.Error()
		}
		t.mu.Lock()
		if !closing {
			e.status.LastEnd, e.status.LastState, e.status.LastDetail = end, state, detail
			if err != nil {
				t.log.Warn("schedule's run failed", "schedule", job.ID, "err", err)
			}
		}
		if e.pending && t.jobs[job.ID] == e && !closing {
			e.pending = false
			t.startLocked(e, end, false)
		} else {
			e.pending, e.running = false, false
		}
		t.mu.Unlock()
		if closing {
			return
		}
		t.save(job.ID, func(r *Record) {
			switch {
			case r.LastStart.After(now):
				return // a later firing started
			case r.LastStart.Equal(now) && r.RunID != "" && !r.LastEnd.IsZero():
				return // recorded with its run's end
			}
			r.LastEnd, r.LastState, r.LastDetail = end, state, detail
		})
	})
}

// followLocked waits, in the background, for the run a previous Table's
// firing of e left going, and ends e's firing with it; t.mu is held.
func (t *Table) followLocked(e *entry, rec Record) {
	id := e.job.ID
	t.log.Info("schedule's last firing is still running after a restart: its next firings skip or wait for it", "schedule", id, "run_id", rec.RunID)
	t.wg.Go(func() {
		err := t.opts.Follow(t.ctx, rec.RunID)
		end := t.clock.Now()
		closing := t.ctx.Err() != nil
		state, detail := StateSucceeded, ""
		if err != nil {
			state, detail = StateFailed, err.Error()
		}
		t.mu.Lock()
		if !closing {
			e.status.LastEnd, e.status.LastState, e.status.LastDetail = end, state, detail
		}
		if e.pending && t.jobs[id] == e && !closing {
			e.pending = false
			t.startLocked(e, end, false)
		} else {
			e.pending, e.running = false, false
		}
		t.mu.Unlock()
		if closing {
			return
		}
		t.save(id, func(r *Record) {
			if r.RunID != rec.RunID || !r.LastEnd.IsZero() {
				return // a later firing, or recorded with its run's end
			}
			r.LastEnd, r.LastState, r.LastDetail = end, state, detail
		})
	})
}

func (t *Table) skip(e *entry, why string, now time.Time, checked bool) {
	t.mu.Lock()
	e.status.LastState, e.status.LastDetail = StateSkipped, why
	id := e.job.ID
	t.mu.Unlock()
	t.log.Info("schedule skipped: "+why, "schedule", id)
	t.save(id, func(r *Record) {
		r.LastState, r.LastDetail = StateSkipped, why
		if checked {
			r.Checked = now
		}
	})
}

// save changes a job's record in the Store, if there is one; a Store that
// fails costs the record, not the firing.
func (t *Table) save(id string, fn func(*Record)) {
	if t.opts.Store == nil {
		return
	}
	if err := t.opts.Store.Update(id, fn); err != nil {
		t.log.Error("cannot record the schedule's firing", "schedule", id, "err", err)
	}
}

// inZone is now in the zone the job's calendar names, else the host's.
func (t *Table) inZone(c compiled, now time.Time) time.Time {
	if loc := c.spec.Location(); loc != nil {
		return now.In(loc)
	}
	return now
}

// List is every job's status, by id. The last firing is the Store's
// record when there is one: it outlives the process, and the scheduler
// writes a run's end into it in the run's own transaction.
func (t *Table) List() []Status {
	var records map[string]Record
	if t.opts.Store != nil {
		var err error
		if records, err = t.opts.Store.Records(); err != nil {
			t.log.Warn("cannot read the schedules' last firings; listing this process's", "err", err)
		}
	}
	now := t.clock.Now()
	t.mu.Lock()
	out := make([]Status, 0, len(t.jobs))
	for id, e := range t.jobs {
		s := e.status
		if r, ok := records[id]; ok && (!r.LastStart.IsZero() || r.LastState != StateNever) {
			s.LastStart, s.LastEnd, s.LastState, s.LastDetail, s.RunID = r.LastStart, r.LastEnd, r.LastState, r.LastDetail, r.RunID
		}
		s.Running = e.running
		if next, ok := e.spec.Next(now); ok {
			s.Next = next
		}
		out = append(out, s)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.ID, b.ID) })
	return out
}

var errClosed = errors.New("cannot change or fire schedules: the table is closed")

// Close stops the loops, cancels the running firings' contexts and waits
// for them to return.
func (t *Table) Close() {
	t.mu.Lock()
	t.stop()
	t.mu.Unlock()
	t.wg.Wait()
}
