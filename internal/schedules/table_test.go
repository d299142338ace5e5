package schedules_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/schedules"
)

// firings is a Fire that reports each firing and holds its run until the
// test releases it, counting how many ran at once.
type firings struct {
	started chan schedules.Job
	release chan error

	mu      sync.Mutex
	running map[string]int
	overlap bool
}

func newFirings() *firings {
	return &firings{started: make(chan schedules.Job, 16), release: make(chan error), running: map[string]int{}}
}

func (f *firings) fire(ctx context.Context, job schedules.Job) error {
	f.mu.Lock()
	f.running[job.ID]++
	if f.running[job.ID] > 1 {
		f.overlap = true
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[job.ID]--
		f.mu.Unlock()
	}()
	f.started <- job
	select {
	case err := <-f.release:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// eventTimeout bounds the wait for an event that must come, so a missing
// one fails the test with a reason instead of hanging it.
const eventTimeout = 30 * time.Second

func (f *firings) next(t *testing.T) schedules.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()
	select {
	case j := <-f.started:
		return j
	case <-ctx.Done():
		t.Fatal("the job did not fire")
	}
	return schedules.Job{}
}

func (f *firings) finish(t *testing.T, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()
	select {
	case f.release <- err:
	case <-ctx.Done():
		t.Fatal("no firing runs to finish")
	}
}

// logBuffer is a journal the test can read, safe for the Table's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type fixture struct {
	table *schedules.Table
	clock *clockwork.FakeClock
	fires *firings
	log   *logBuffer
}

// monday0855 is a Monday morning, in UTC.
var monday0855 = time.Date(2026, 11, 30, 8, 55, 0, 0, time.UTC)

func newFixture(t *testing.T, jobs ...schedules.Job) *fixture {
	t.Helper()
	f := &fixture{clock: clockwork.NewFakeClockAt(monday0855), fires: newFirings(), log: &logBuffer{}}
	table, err := schedules.New(schedules.Options{Fire: f.fires.fire, Clock: f.clock, Logger: slog.New(slog.NewTextHandler(f.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(table.Close)
	f.table = table
	if err := table.Set(t.Context(), jobs); err != nil {
		t.Fatal(err)
	}
	return f
}

// waitLoops waits until n job loops are asleep on the clock.
func (f *fixture) waitLoops(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()
	if err := f.clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("%d loops did not wait on the clock: %v", n, err)
	}
}

// advanceTo moves the clock to at in the loops' one-minute steps, so each
// loop sees every minute it sleeps through.
func (f *fixture) advanceTo(t *testing.T, at time.Time, loops int) {
	t.Helper()
	for f.clock.Now().Before(at) {
		f.waitLoops(t, loops)
		f.clock.Advance(min(time.Minute, at.Sub(f.clock.Now())))
	}
}

// idle waits until the job's firing has ended and its end is recorded
// (by the firing's own goroutine, after Fire returned).
func (f *fixture) idle(t *testing.T, id string) schedules.Status {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for {
		s := f.status(t, id)
		if !s.Running {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %s still runs", id)
		}
		runtime.Gosched()
	}
}

func (f *fixture) status(t *testing.T, id string) schedules.Status {
	t.Helper()
	for _, s := range f.table.List() {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("schedule %s is not listed", id)
	return schedules.Status{}
}

func standup() schedules.Job {
	return schedules.Job{
		ID:         "standup",
		OnCalendar: "Mon..Fri 09:00 UTC",
		Agent:      "helper",
		Prompt:     "Summarise yesterday",
		DeliverTo:  schedules.Destination{Connector: "hooks", Channel: "ops"},
	}
}

func at(hour, minute int) time.Time {
	return time.Date(2026, 11, 30, hour, minute, 0, 0, time.UTC)
}

func TestAJobFiresAtItsCalendarsElapses(t *testing.T) {
	t.Parallel()
	f := newFixture(t, standup())
	if next := f.status(t, "standup").Next; !next.Equal(at(9, 0)) {
		t.Fatalf("next run %s, want Monday 09:00", next)
	}
	f.advanceTo(t, at(9, 0), 1)
	if job := f.fires.next(t); job.Prompt != "Summarise yesterday" || job.DeliverTo.Channel != "ops" {
		t.Errorf("fired %+v", job)
	}
	if s := f.status(t, "standup"); s.LastState != schedules.StateRunning || !s.Running || !s.LastStart.Equal(at(9, 0)) {
		t.Errorf("while it runs: %+v", s)
	}
	f.fires.finish(t, nil)
	f.waitLoops(t, 1)
	s := f.idle(t, "standup")
	if s.LastState != schedules.StateSucceeded || !s.Next.Equal(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("after it ran: %+v", s)
	}
	if !strings.Contains(f.log.String(), "schedule fired") {
		t.Errorf("no journal line for the firing:\n%s", f.log)
	}
}

func TestAFiringMissedWhileTheClockJumpedHappensOnce(t *testing.T) {
	t.Parallel()
	job := standup()
	job.OnCalendar = "hourly UTC"
	f := newFixture(t, job)
	f.waitLoops(t, 1)
	f.clock.Advance(5 * time.Hour) // a suspended machine wakes up
	f.fires.next(t)
	f.fires.finish(t, nil)
	f.waitLoops(t, 1)
	if next := f.status(t, job.ID).Next; !next.Equal(at(14, 0)) {
		t.Errorf("next run %s, want the next hour after the jump, 14:00", next)
	}
	if journal := f.log.String(); strings.Count(journal, "schedule fired") != 1 || strings.Contains(journal, "schedule skipped") {
		t.Errorf("the hours slept through were fired or skipped one by one:\n%s", journal)
	}
}

func TestASecondFiringIsSkippedWhileTheFirstRuns(t *testing.T) {
	t.Parallel()
	job := standup()
	job.OnCalendar = "*:0/5 UTC"
	f := newFixture(t, job)
	f.advanceTo(t, at(9, 0), 1)
	f.fires.next(t)
	f.advanceTo(t, at(9, 5), 1) // the first run is still going
	f.waitLoops(t, 1)           // the loop is back asleep: the 09:05 firing was decided
	s := f.status(t, job.ID)
	if s.LastState != schedules.StateSkipped || !strings.Contains(s.LastDetail, "still running") {
		t.Errorf("09:05 left %+v", s)
	}
	if !strings.Contains(f.log.String(), "schedule skipped: its previous firing is still running") {
		t.Errorf("no journal line for the skip:\n%s", f.log)
	}
	if out, err := f.table.Trigger(job.ID, schedules.Manual); err != nil || out != schedules.Skipped {
		t.Errorf("a manual run during the firing: %v, %v; want it skipped too", out, err)
	}
	f.fires.finish(t, errors.New("the agent gave up"))
	if s := f.idle(t, job.ID); s.LastState != schedules.StateFailed || s.LastDetail != "the agent gave up" {
		t.Errorf("after the failed run: %+v", s)
	}
	f.advanceTo(t, at(9, 10), 1)
	f.fires.next(t) // the job fires again once the first run ended
	f.fires.finish(t, nil)
	if f.fires.overlap {
		t.Error("two firings of the job ran at once")
	}
}

func TestWithOverlapWaitAFiringRunsWhenThePreviousEnds(t *testing.T) {
	t.Parallel()
	job := standup()
	job.OnCalendar = "*:0/5 UTC"
	job.Overlap = schedules.OverlapWait
	f := newFixture(t, job)
	f.advanceTo(t, at(9, 0), 1)
	f.fires.next(t)
	if out, err := f.table.Trigger(job.ID, schedules.Manual); err != nil || out != schedules.Queued {
		t.Fatalf("a manual run during the firing: %v, %v; want it queued", out, err)
	}
	f.advanceTo(t, at(9, 5), 1) // shares the queued firing
	f.waitLoops(t, 1)
	f.fires.finish(t, errors.New("the model timed out"))
	f.fires.next(t) // the queued one starts as the first ends
	if s := f.status(t, job.ID); s.LastState != schedules.StateRunning || !s.LastStart.Equal(at(9, 5)) {
		t.Errorf("the queued firing: %+v", s)
	}
	f.fires.finish(t, nil)
	f.idle(t, job.ID)
	f.advanceTo(t, at(9, 10), 1)
	f.fires.next(t)
	f.fires.finish(t, nil)
	if f.fires.overlap {
		t.Error("two firings of the job ran at once")
	}
	if n := len(f.fires.started); n != 0 {
		t.Errorf("%d firings more than one per elapse", n)
	}
}

func TestActiveHoursHoldScheduledFiringsOnly(t *testing.T) {
	t.Parallel()
	job := standup()
	job.OnCalendar = "*:0/30 UTC"
	job.ActiveHours = "09:15-17:00"
	f := newFixture(t, job)
	f.advanceTo(t, at(9, 0), 1)
	f.waitLoops(t, 1)
	if s := f.status(t, job.ID); s.LastState != schedules.StateSkipped || !strings.Contains(s.LastDetail, "active hours") {
		t.Errorf("09:00, before its hours: %+v", s)
	}
	if out, err := f.table.Trigger(job.ID, schedules.Manual); err != nil || out != schedules.Started {
		t.Fatalf("an admin's run outside the hours: %v, %v; want it started", out, err)
	}
	f.fires.next(t)
	f.fires.finish(t, nil)
	f.idle(t, job.ID)
	f.advanceTo(t, at(9, 30), 1)
	f.fires.next(t)
	f.fires.finish(t, nil)
}

func TestSetReplacesChangedJobsAndRemovesGoneOnes(t *testing.T) {
	t.Parallel()
	gone := standup()
	gone.ID = "gone"
	f := newFixture(t, standup(), gone)
	f.waitLoops(t, 2)

	changed := standup()
	changed.OnCalendar = "Mon 08:57 UTC"
	if err := f.table.Set(t.Context(), []schedules.Job{changed}); err != nil {
		t.Fatal(err)
	}
	if list := f.table.List(); len(list) != 1 || list[0].ID != "standup" || !list[0].Next.Equal(at(8, 57)) {
		t.Fatalf("after Set: %+v", list)
	}
	f.advanceTo(t, at(8, 57), 1) // one loop left: gone's ended
	if job := f.fires.next(t); job.OnCalendar != changed.OnCalendar {
		t.Errorf("fired %+v, want the changed job", job)
	}
	f.fires.finish(t, nil)
}

func TestAWrongJobChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, standup())
	valid := standup()
	valid.ID = "other"
	bad := []struct {
		name string
		edit func(*schedules.Job)
		says string
	}{
		{"Bad_calendar", func(j *schedules.Job) { j.OnCalendar = "Mon..Fri 25:00" }, `cannot use schedule "standup": on_calendar: cannot parse calendar expression "Mon..Fri 25:00": the hour 25 is outside 0..23`},
		{"Id_unfit_for_a_unit_name", func(j *schedules.Job) { j.ID = "Stand Up" }, "its id must be"},
		{"No_agent", func(j *schedules.Job) { j.Agent = "" }, "it names no agent"},
		{"Both_prompts", func(j *schedules.Job) { j.PromptFile = "HEARTBEAT.md" }, "exactly one of prompt and prompt_file"},
		{"Prompt_file_outside_the_workspace", func(j *schedules.Job) { j.Prompt, j.PromptFile = "", "../etc/passwd" }, "inside the agent's workspace"},
		{"No_channel", func(j *schedules.Job) { j.DeliverTo.Channel = "" }, "deliver_to needs a connector and a channel"},
		{"Unknown_overlap", func(j *schedules.Job) { j.Overlap = "queue" }, `overlap "queue" is neither "skip" nor "wait"`},
		{"Empty_active_hours", func(j *schedules.Job) { j.ActiveHours = "09:00-09:00" }, "it starts where it ends"},
		{"Active_hours_without_a_range", func(j *schedules.Job) { j.ActiveHours = "9am" }, "is not written HH:MM-HH:MM"},
		{"Negative_runtime", func(j *schedules.Job) { j.MaxRuntime = -time.Second }, "max_runtime -1s is negative"},
		{"Same_id_twice", func(j *schedules.Job) { j.ID = "other" }, `cannot use schedule "other": its id is used twice`},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			job := standup()
			c.edit(&job)
			err := f.table.Set(t.Context(), []schedules.Job{valid, job})
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Set: %v, want an error saying %q", err, c.says)
			}
		})
	}
	if list := f.table.List(); len(list) != 1 || list[0].ID != "standup" {
		t.Errorf("a refused Set changed the table: %+v", list)
	}
	if _, err := f.table.Trigger("other", schedules.Manual); !errors.Is(err, schedules.ErrUnknown) {
		t.Errorf("Trigger of an unknown id: %v", err)
	}
}

func TestOnlyAReplyOfExactlyHeartbeatOKIsQuiet(t *testing.T) {
	t.Parallel()
	for reply, quiet := range map[string]bool{
		"HEARTBEAT_OK":                       true,
		"HEARTBEAT_OK\n":                     true,
		"  HEARTBEAT_OK ":                    true,
		"heartbeat_ok":                       false,
		"HEARTBEAT_OK, and the disk is full": false,
		"The build is red. HEARTBEAT_OK":     false,
		"":                                   false,
	} {
		if got := schedules.Quiet(reply); got != quiet {
			t.Errorf("Quiet(%q) = %v, want %v", reply, got, quiet)
		}
	}
}

func TestAPromptFileIsReadFromInsideTheWorkspace(t *testing.T) {
	t.Parallel()
	workspace := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(workspace, "HEARTBEAT.md"), []byte("Check the queue; reply HEARTBEAT_OK if it is empty."), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("not for the model"), 0o600); err != nil {
		t.Fatal(err)
	}
	target, err := filepath.Rel(workspace, filepath.Join(outside, "secret"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(workspace, "LINK.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(workspace, "EMPTY.md"), []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	job := standup()
	job.Prompt, job.PromptFile = "", "HEARTBEAT.md"
	if got, err := job.ReadPrompt(workspace); err != nil || !strings.HasPrefix(got, "Check the queue") {
		t.Errorf("ReadPrompt = %q, %v", got, err)
	}
	for file, says := range map[string]string{"LINK.md": "cannot read the prompt", "EMPTY.md": "is empty", "MISSING.md": "no such file"} {
		job.PromptFile = file
		if got, err := job.ReadPrompt(workspace); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ReadPrompt of %s = %q, %v; want an error saying %q", file, got, err, says)
		}
	}
}

func ExampleQuiet() {
	fmt.Println(schedules.Quiet("HEARTBEAT_OK"), schedules.Quiet("The backup failed."))
	// Output: true false
}
