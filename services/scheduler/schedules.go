package scheduler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/calendar"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/internal/tracing"
)

// scheduleSetTimeout bounds giving the table its jobs; under systemd that
// reconciles the timers, a few calls to systemd per job.
const scheduleSetTimeout = 2 * time.Minute

// scheduled is the scheduler's side of [[schedules]]: the table that fires
// the jobs, and who waits for the end of which fired run.
type scheduled struct {
	table *schedules.Table

	mu      sync.Mutex
	waiters map[string]chan struct{} // run id → closed when the run ends
}

// startSchedules makes the table and gives it the configuration's jobs.
// New calls it, so the jobs are there before Export claims the bus name
// that a timer's FireSchedule reaches.
func (s *Service) startSchedules(cfg *config.Config) error {
	opts := schedules.Options{
		Fire:   s.fireSchedule,
		Timers: s.opts.ScheduleTimers,
		Clock:  s.clock,
		Store:  scheduleStore{s.store},
		// Without systemd the table keeps the time, and catches up a job
		// missed while the scheduler was not running; under systemd the
		// timer does (Persistent=true).
		CatchUp: s.opts.ScheduleTimers == nil && !s.opts.noScheduleCatchUp,
		Logger:  s.log,
	}
	if !s.opts.noScheduleFollow {
		opts.Follow = s.followScheduledRun
	}
	t, err := schedules.New(opts)
	if err != nil {
		return err
	}
	s.scheduled.table = t
	s.scheduled.waiters = map[string]chan struct{}{}
	s.setSchedules(cfg)
	return nil
}

// setSchedules makes cfg's jobs the table's. The configuration was
// validated, so what can fail is systemd: the table has the jobs anyway
// (FireSchedule and RunSchedule find them), and the next reload tries the
// timers again.
func (s *Service) setSchedules(cfg *config.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), scheduleSetTimeout)
	defer cancel()
	if err := s.scheduled.table.Set(ctx, cfg.Schedules); err != nil {
		s.log.Error("cannot set the scheduled jobs", "err", err)
	}
}

// closeSchedules stops the table: no job fires after it, and the firings
// under way stop waiting for their runs (which go on).
func (s *Service) closeSchedules() {
	if s.scheduled.table != nil {
		s.scheduled.table.Close()
	}
}

// fireSchedule is the table's Fire: the job's prompt becomes a normal run
// of its agent whose reply goes to the job's destination, and it returns
// when that run has ended.
func (s *Service) fireSchedule(ctx context.Context, job schedules.Job) error {
	cfg := s.cfg.Load()
	agent, err := cfg.Agent(job.Agent)
	if err != nil {
		return fmt.Errorf("cannot fire schedule %q: %w", job.ID, err)
	}
	text, err := job.ReadPrompt(runplan.WorkspaceOf(agent, s.stateDir))
	if err != nil {
		return err
	}
	// A firing starts a trace of its own (when tracing is on): its run's
	// spans and its delivery hang under the fire span, as a message's hang
	// under intake's hand-off.
	fireCtx, span := tracing.Tracer().Start(ctx, spanScheduleFire, trace.WithNewRoot(),
		trace.WithAttributes(attribute.String("berth.schedule", job.ID), attribute.String("berth.agent", job.Agent)))
	msg := busapi.Submission{
		// One run per firing: a retried Submit of the same firing finds it.
		MessageID:   fmt.Sprintf("schedule:%s:%d", job.ID, s.clock.Now().Unix()),
		Agent:       job.Agent,
		Connector:   job.DeliverTo.Connector,
		Channel:     job.DeliverTo.Channel,
		Thread:      job.DeliverTo.Thread,
		Author:      "schedule:" + job.ID,
		Text:        text,
		Traceparent: tracing.Traceparent(fireCtx),
	}
	runID, err := s.submitScheduled(msg, job)
	if err != nil {
		span.SetStatus(codes.Error, "the firing was not queued")
	} else {
		span.SetAttributes(attribute.String("berth.run_id", runID))
	}
	span.End()
	if err != nil {
		return fmt.Errorf("cannot fire schedule %q: %w", job.ID, err)
	}
	return s.followRun(ctx, runID)
}

// followScheduledRun is the table's Follow: the run a firing before a
// restart left going.
func (s *Service) followScheduledRun(ctx context.Context, runID string) error {
	return s.followRun(ctx, runID)
}

// followRun waits until run runID ends; a run that did not succeed is the
// error.
func (s *Service) followRun(ctx context.Context, runID string) error {
	ended := s.scheduled.waitFor(runID)
	defer s.scheduled.forget(runID)
	for {
		r, err := s.GetRun(runID)
		if err != nil {
			return fmt.Errorf("cannot follow run %s: %w", runID, err)
		}
		if Finished(r.State) {
			if state, detail := scheduledOutcome(r); state != schedules.StateSucceeded {
				return errors.New(detail)
			}
			return nil
		}
		select {
		case <-ended:
			ended = s.scheduled.waitFor(runID) // read it once more, then wait again if need be
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for run %s: %w", runID, context.Cause(ctx))
		}
	}
}

// submitScheduled is Submit for a fired job: the run is marked as the
// job's in the same transaction that queues it, so its delivery knows it.
func (s *Service) submitScheduled(msg busapi.Submission, job schedules.Job) (string, error) {
	known := s.cfg.Load().AgentIDs()
	var (
		r       Run
		created bool
		refused error
	)
	err := s.store.write(func(tx *bolt.Tx) error {
		var err error
		r, created, refused, err = s.queueMessage(tx, msg, known)
		if err != nil || !created {
			return err
		}
		markScheduled(&r, job)
		return putRun(tx, r)
	})
	if err != nil {
		return "", fmt.Errorf("cannot store run: %w", err)
	}
	if refused != nil {
		return "", refused
	}
	if created {
		s.log.Info("run queued", "run_id", r.ID, "agent", r.Agent, "message_id", r.MessageID, "connector", r.Connector, "schedule", job.ID,
			"model", r.Model, "max_runtime_seconds", r.MaxRuntimeSeconds)
		s.emitStateChanged(r)
		s.publishCounts()
		wake(s.wakeDispatch)
	}
	return r.ID, nil
}

// waitFor is a channel closed when run id next ends (runEnded).
func (w *scheduled) waitFor(id string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.waiters[id]
	if !ok {
		ch = make(chan struct{})
		w.waiters[id] = ch
	}
	return ch
}

func (w *scheduled) forget(id string) {
	w.mu.Lock()
	delete(w.waiters, id)
	w.mu.Unlock()
}

// runEnded wakes whoever waits for run id; emitFinished calls it for
// every run that reaches a final state.
func (w *scheduled) runEnded(id string) {
	w.mu.Lock()
	ch, ok := w.waiters[id]
	delete(w.waiters, id)
	w.mu.Unlock()
	if ok {
		close(ch)
	}
}

// quietHeartbeat says whether a finished run is a scheduled job's that
// checked in with HEARTBEAT_OK: it is marked delivered without intake.
func quietHeartbeat(r Run) bool {
	return r.Schedule != "" && r.State == StateSucceeded && schedules.Quiet(r.Reply)
}

// ListSchedules is every job with its destination and how its firings went.
func (s *Service) ListSchedules() []busapi.Schedule {
	jobs := map[string]schedules.Job{}
	for _, j := range s.cfg.Load().Schedules {
		jobs[j.ID] = j
	}
	var out []busapi.Schedule
	for _, st := range s.scheduled.table.List() {
		j := jobs[st.ID]
		onCalendar := j.OnCalendar
		if spec, err := calendar.Parse(j.OnCalendar); err == nil {
			onCalendar = spec.String()
		}
		out = append(out, busapi.Schedule{
			ID: st.ID, Agent: j.Agent, OnCalendar: onCalendar,
			Connector: j.DeliverTo.Connector, Channel: j.DeliverTo.Channel, Thread: j.DeliverTo.Thread,
			Next: st.Next, LastStart: st.LastStart, LastEnd: st.LastEnd,
			LastState: string(st.LastState), LastDetail: st.LastDetail, LastRun: st.RunID, Running: st.Running,
		})
	}
	return out
}

// TriggerSchedule fires job id now: cause schedules.Scheduled for its
// timer, schedules.Manual for an admin.
func (s *Service) TriggerSchedule(id string, cause schedules.Cause) (schedules.Outcome, error) {
	outcome, err := s.scheduled.table.Trigger(id, cause)
	if errors.Is(err, schedules.ErrUnknown) {
		return "", fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	return outcome, err
}

// FireSchedule is what a job's systemd timer calls: root only, as the
// timer's service runs.
func (o *schedulerObject) FireSchedule(sender dbus.Sender, id string) (string, *dbus.Error) {
	c, err := bus.CallerOf(o.conn, sender)
	if err != nil {
		return "", bus.NewError(bus.ErrAccessDenied, "%v", err)
	}
	if c.UID != 0 && c.UID != uint32(os.Getuid()) {
		return "", bus.NewError(bus.ErrAccessDenied, "only root fires a schedule as its timer does; use RunSchedule")
	}
	outcome, err := o.s.TriggerSchedule(id, schedules.Scheduled)
	if err != nil {
		return "", dbusError(err)
	}
	return string(outcome), nil
}

// RunSchedule is berthctl schedules run: root and berth-admin.
func (o *schedulerObject) RunSchedule(sender dbus.Sender, id string) (string, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return "", derr
	}
	outcome, err := o.s.TriggerSchedule(id, schedules.Manual)
	if err != nil {
		return "", dbusError(err)
	}
	return string(outcome), nil
}

func (o *schedulerObject) ListSchedules(sender dbus.Sender) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	list := o.s.ListSchedules()
	out := make([]map[string]dbus.Variant, 0, len(list))
	for _, sc := range list {
		out = append(out, sc.Wire())
	}
	return out, nil
}
