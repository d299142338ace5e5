package scheduler

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/isolation"
)

// openAt opens a scheduler on stateDir and clock, with b as its backend
// and the journal in log; the caller closes it (a restart closes the first
// before the second opens).
func openAt(t *testing.T, cfg *config.Config, stateDir string, clock clockwork.Clock, b *gateBackend, log *logBuffer, with ...func(*Options)) *Service {
	t.Helper()
	opts := Options{
		Backends: map[string]isolation.Backend{"landlock": b},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
		Clock:    clock,
	}
	if log != nil {
		withLog(log)(&opts)
	}
	for _, f := range with {
		f(&opts)
	}
	s, err := New(cfg, stateDir, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// listed is job id's line of s's ListSchedules.
func listed(t *testing.T, s *Service, id string) busapi.Schedule {
	t.Helper()
	for _, sc := range s.ListSchedules() {
		if sc.ID == id {
			return sc
		}
	}
	t.Fatalf("schedule %s is not listed: %+v", id, s.ListSchedules())
	return busapi.Schedule{}
}

// waitListed waits until job id's line says state.
func waitListed(t *testing.T, s *Service, id string, state schedules.State) busapi.Schedule {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sc := listed(t, s, id)
		if sc.LastState == string(state) && !sc.Running {
			return sc
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %s listed %+v, want last state %q", id, sc, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func scheduledConfig(jobs ...schedules.Job) *config.Config {
	cfg := testConfig(4)
	cfg.Schedules = jobs
	return cfg
}

var restartClock = time.Date(2026, 12, 2, 8, 59, 30, 0, time.UTC)

func TestAJobsLastFiringIsListedAfterARestart(t *testing.T) {
	t.Parallel()
	cfg := scheduledConfig(standup("echo one"))
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	gate := newGateBackend("landlock")
	first := openAt(t, cfg, stateDir, clock, gate, nil)
	stop := start(t, first)
	if out, err := first.TriggerSchedule("standup", schedules.Manual); err != nil || out != schedules.Started {
		t.Fatalf("TriggerSchedule = %v, %v", out, err)
	}
	run := gate.next(t)
	run.reply("done")
	before := waitListed(t, first, "standup", schedules.StateSucceeded)
	if before.LastRun != run.spec.RunID || before.LastStart.IsZero() || before.LastEnd.IsZero() {
		t.Fatalf("before the restart: %+v, want the run %s with its start and end", before, run.spec.RunID)
	}
	stop()
	first.Close()

	second := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil)
	defer second.Close()
	after := listed(t, second, "standup")
	if after.LastState != string(schedules.StateSucceeded) || after.LastRun != before.LastRun ||
		!after.LastStart.Equal(before.LastStart) || !after.LastEnd.Equal(before.LastEnd) {
		t.Fatalf("after the restart: %+v, want %+v", after, before)
	}
}

// The control: without its record a restarted scheduler knows nothing of
// the last firing, so the test above reads the record.
func TestWithoutItsRecordARestartedSchedulerListsNoLastFiring(t *testing.T) {
	t.Parallel()
	cfg := scheduledConfig(standup("echo one"))
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	gate := newGateBackend("landlock")
	first := openAt(t, cfg, stateDir, clock, gate, nil)
	stop := start(t, first)
	if _, err := first.TriggerSchedule("standup", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	gate.next(t).reply("done")
	waitListed(t, first, "standup", schedules.StateSucceeded)
	stop()
	err := first.store.update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketSchedules) })
	first.Close()
	if err != nil {
		t.Fatal(err)
	}
	second := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil)
	defer second.Close()
	if sc := listed(t, second, "standup"); sc.LastState != "" || !sc.LastStart.IsZero() {
		t.Fatalf("without the record: %+v, want never", sc)
	}
}

// A run still going when the scheduler stops ends in the next one, which
// did not fire it: the run's own end commit brings the job's record up to
// date.
func TestARunThatEndsAfterARestartRecordsItsJobsLastState(t *testing.T) {
	t.Parallel()
	cfg := scheduledConfig(standup("echo one"))
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	var log logBuffer
	first := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil)
	// Not started: the firing's run stays queued.
	if _, err := first.TriggerSchedule("standup", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for listed(t, first, "standup").LastRun == "" {
		if time.Now().After(deadline) {
			t.Fatalf("the firing's run was not recorded: %+v", listed(t, first, "standup"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	runID := listed(t, first, "standup").LastRun
	first.Close()

	gate := newGateBackend("landlock")
	second := openAt(t, cfg, stateDir, clock, gate, &log)
	defer second.Close()
	if sc := listed(t, second, "standup"); sc.LastState != string(schedules.StateRunning) || sc.LastRun != runID || !sc.Running {
		t.Fatalf("after the restart: %+v, want run %s listed running (by the record, followed by this process)", sc, runID)
	}
	stop := start(t, second)
	defer stop()
	run := gate.next(t)
	if run.spec.RunID != runID {
		t.Fatalf("ran %s, want the queued %s", run.spec.RunID, runID)
	}
	run.finish <- outcome{res: isolation.Result{Response: agentproto.Response{Version: 1, RunID: runID, Error: "the model gave up"}}}
	sc := waitListed(t, second, "standup", schedules.StateFailed)
	if sc.LastRun != runID || !strings.Contains(sc.LastDetail, "run "+runID+" failed") || sc.LastEnd.IsZero() {
		t.Fatalf("after the run ended: %+v", sc)
	}
	if strings.Contains(log.String(), "schedule fired") {
		t.Fatalf("the second scheduler fired the job; this test is about a run it did not fire:\n%s", log.String())
	}
}

// missedWhileDown runs a scheduler with an hourly job until 08:59:30, stops
// it, lets three elapses pass (09:00, 10:00, 11:00) and starts another on
// the same scheduler.db: it says how many firings the second made, and the
// runs it queued.
func missedWhileDown(t *testing.T, catchUp bool, with ...func(*Options)) (fired int, runs []Summary, journal string) {
	t.Helper()
	job := standup("echo caught up")
	job.OnCalendar = "hourly UTC"
	cfg := scheduledConfig(job)
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	first := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil)
	first.Close()
	clock.Advance(3 * time.Hour)

	var log logBuffer
	with = append(with, func(o *Options) { o.noScheduleCatchUp = !catchUp })
	second := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), &log, with...)
	defer second.Close()
	// New decided the catch-up: a firing is under way by its return.
	journal = log.String()
	fired = strings.Count(journal, "schedule fired")
	if fired > 0 {
		deadline := time.Now().Add(20 * time.Second)
		for listed(t, second, "standup").LastRun == "" {
			if time.Now().After(deadline) {
				t.Fatalf("the catch-up queued no run: %+v", listed(t, second, "standup"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	runs, err := second.ListRuns(RunFilter{Schedule: "standup"})
	if err != nil {
		t.Fatal(err)
	}
	return fired, runs, journal
}

func TestAJobMissedWhileTheSchedulerWasDownFiresOnceAtStart(t *testing.T) {
	t.Parallel()
	fired, runs, journal := missedWhileDown(t, true)
	if fired != 1 || len(runs) != 1 {
		t.Fatalf("%d firings and %d runs after three missed elapses, want one of each:\n%s", fired, len(runs), journal)
	}
	if !strings.Contains(journal, "schedule missed while berth-scheduler was not running: it fires once now") || !strings.Contains(journal, "missed=2026-12-02T09:00:00") {
		t.Errorf("the catch-up has no journal line naming the first missed elapse:\n%s", journal)
	}
	if runs[0].Schedule != "standup" || !runs[0].CreatedAt.Equal(restartClock.Add(3*time.Hour)) {
		t.Errorf("the catch-up's run: %+v", runs[0])
	}
}

// The control: with the catch-up off, the same restart fires nothing, so
// the test above fails without it.
func TestWithoutTheCatchUpAJobMissedWhileTheSchedulerWasDownDoesNotFire(t *testing.T) {
	t.Parallel()
	if fired, runs, journal := missedWhileDown(t, false); fired != 0 || len(runs) != 0 {
		t.Fatalf("with the catch-up off: %d firings, %d runs:\n%s", fired, len(runs), journal)
	}
}

// timersStandIn is a Timers that keeps no time: under systemd the timer
// (Persistent=true) catches a missed job up, and the table must not too.
type timersStandIn struct{}

func (timersStandIn) Reconcile(context.Context, []schedules.Job) error { return nil }

func TestUnderSystemdTheTableLeavesTheCatchUpToTheTimer(t *testing.T) {
	t.Parallel()
	// The record of a job whose time the table kept, three elapses ago.
	job := standup("echo caught up")
	job.OnCalendar = "hourly UTC"
	cfg := scheduledConfig(job)
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil).Close()
	clock.Advance(3 * time.Hour)

	var log logBuffer
	s := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), &log, func(o *Options) { o.ScheduleTimers = timersStandIn{} })
	defer s.Close()
	if strings.Contains(log.String(), "schedule fired") || listed(t, s, "standup").Running {
		t.Fatalf("under systemd the table fired the missed job itself:\n%s", log.String())
	}
}

func TestAReloadRemovesTheRecordsOfRemovedJobs(t *testing.T) {
	t.Parallel()
	gone := standup("echo gone")
	gone.ID = "gone"
	cfg := scheduledConfig(standup("echo kept"), gone)
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClockAt(restartClock)))
	if _, err := s.TriggerSchedule("gone", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for listed(t, s, "gone").LastRun == "" {
		if time.Now().After(deadline) {
			t.Fatal("the firing's run was not recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ids := func() []string {
		recs, err := scheduleStore{s.store}.Records()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for id := range recs {
			out = append(out, id)
		}
		slices.Sort(out)
		return out
	}
	if got := ids(); !slices.Equal(got, []string{"gone", "standup"}) {
		t.Fatalf("records %v before the reload, want gone and standup", got)
	}
	s.Reload(scheduledConfig(standup("echo kept")))
	if got := ids(); !slices.Equal(got, []string{"standup"}) {
		t.Fatalf("records %v after the reload, want standup alone", got)
	}
}

func TestListRunsNamesAndFiltersTheJobThatFiredARun(t *testing.T) {
	t.Parallel()
	s := newTestService(t, scheduledConfig(standup("echo fired")), "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClockAt(restartClock)))
	msgRun, err := s.Submit(busapi.SubmissionFromWire(map[string]string{"id": "m1", "agent": "alpha", "text": "a message"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TriggerSchedule("standup", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for listed(t, s, "standup").LastRun == "" {
		if time.Now().After(deadline) {
			t.Fatal("the firing's run was not recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	firedRun := listed(t, s, "standup").LastRun

	all, err := s.ListRuns(RunFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("ListRuns = %+v, %v; want two runs", all, err)
	}
	for _, sum := range all {
		head, err := busapi.RunSummaryFromWire(sum.Wire())
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{msgRun: "", firedRun: "standup"}[sum.ID]; head.Schedule != want {
			t.Errorf("run %s on the bus names schedule %q, want %q", sum.ID, head.Schedule, want)
		}
	}
	lf, err := busapi.ListFilterFromWire(busapi.ListFilter{Schedule: "standup"}.Wire())
	if err != nil {
		t.Fatal(err)
	}
	only, err := s.ListRuns(RunFilter{Schedule: lf.Schedule, Agent: lf.Agent})
	if err != nil || len(only) != 1 || only[0].ID != firedRun {
		t.Fatalf("ListRuns of schedule standup = %+v, %v; want %s alone", only, err, firedRun)
	}
}

// overlapAcrossARestart fires the job in one scheduler whose backend never
// starts its run, restarts on the same scheduler.db, and fires it again in
// the second before the first firing's run ends: it returns the second
// firing's outcome and the job's runs.
func overlapAcrossARestart(t *testing.T, with ...func(*Options)) (schedules.Outcome, []Summary, *Service, *gateBackend, string) {
	t.Helper()
	cfg := scheduledConfig(standup("echo one at a time"))
	stateDir := t.TempDir()
	clock := clockwork.NewFakeClockAt(restartClock)
	first := openAt(t, cfg, stateDir, clock, newGateBackend("landlock"), nil)
	if _, err := first.TriggerSchedule("standup", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for listed(t, first, "standup").LastRun == "" {
		if time.Now().After(deadline) {
			t.Fatalf("the firing's run was not recorded: %+v", listed(t, first, "standup"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	runID := listed(t, first, "standup").LastRun
	first.Close()
	// A firing's message id has its second in it: a later second is
	// another firing, not a retried Submit of the same one (and the
	// job's 09:00 is not due yet).
	clock.Advance(10 * time.Second)

	gate := newGateBackend("landlock")
	second := openAt(t, cfg, stateDir, clock, gate, nil, with...)
	t.Cleanup(func() { second.Close() })
	out, err := second.TriggerSchedule("standup", schedules.Manual)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := second.ListRuns(RunFilter{Schedule: "standup"})
	if err != nil {
		t.Fatal(err)
	}
	return out, runs, second, gate, runID
}

// Two firings of one job never overlap, across a restart too: the first
// scheduler's firing left its run queued, so the second scheduler's firing
// is skipped until that run has ended.
func TestAFiringAfterARestartSkipsWhileThePreviousFiringsRunIsGoing(t *testing.T) {
	t.Parallel()
	out, runs, second, gate, runID := overlapAcrossARestart(t)
	if out != schedules.Skipped || len(runs) != 1 {
		t.Fatalf("the firing after the restart was %q with %d runs of the job, want skipped beside the one run", out, len(runs))
	}
	if sc := listed(t, second, "standup"); !strings.Contains(sc.LastDetail, "still running") {
		t.Errorf("the skip is not explained: %+v", sc)
	}
	stop := start(t, second)
	defer stop()
	run := gate.next(t)
	if run.spec.RunID != runID {
		t.Fatalf("ran %s, want the first firing's %s", run.spec.RunID, runID)
	}
	run.finish <- outcome{res: isolation.Result{Response: agentproto.Response{Version: 1, RunID: runID, Reply: "done"}}}
	waitListed(t, second, "standup", schedules.StateSucceeded)
	if out, err := second.TriggerSchedule("standup", schedules.Manual); err != nil || out != schedules.Started {
		t.Fatalf("once the run ended a firing was %q (%v), want started", out, err)
	}
}

// The control: a restarted scheduler that does not follow the run starts a
// second one beside it.
func TestWithoutFollowingTheRunAFiringAfterARestartOverlaps(t *testing.T) {
	t.Parallel()
	out, _, second, _, _ := overlapAcrossARestart(t, func(o *Options) { o.noScheduleFollow = true })
	if out != schedules.Started {
		t.Fatalf("the firing was %q, want started: this control shows the test above can fail", out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		runs, err := second.ListRuns(RunFilter{Schedule: "standup"})
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 2 {
			return // a second run beside the first
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs of the job, want 2 without the follow", len(runs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
