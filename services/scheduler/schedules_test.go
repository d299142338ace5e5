package scheduler

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// scheduledSetup is a scheduler with one job, due in 30 seconds on a fake
// clock, whose runs go through the real landlock backend to the test
// agent; replies go over a private bus to a stand-in of intake.
type scheduledSetup struct {
	s      *Service
	clock  *clockwork.FakeClock
	intake *intakeStandIn
	bus    *testbus.Bus
}

func newScheduledSetup(t *testing.T, job schedules.Job, prepare func(stateDir string)) scheduledSetup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: the landlock backend runs the agent as user nobody")
	}
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	intakeConn := b.Conn(t)
	intake := &intakeStandIn{got: make(chan map[string]string, 4)}
	if err := intakeConn.Export(intake, bus.IntakePath, bus.IntakeInterface); err != nil {
		t.Fatal(err)
	}
	if reply, err := intakeConn.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("cannot own %s: %v %v", bus.IntakeName, reply, err)
	}

	cfg := testConfig(4)
	cfg.Scheduler.AgentBinary = testAgent(t)
	cfg.Schedules = []schedules.Job{job}
	stateDir := sharedStateDir(t)
	if prepare != nil {
		prepare(stateDir)
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 2, 8, 59, 30, 0, time.UTC))
	s := newTestService(t, cfg, stateDir, nil, BusDeliverer{Conn: b.Conn(t)}, withClock(clock), func(o *Options) {
		o.Backends = map[string]isolation.Backend{landlock.Name: landlock.New()}
	})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return scheduledSetup{s: s, clock: clock, intake: intake, bus: b}
}

// fireByClock lets the job's elapse come: the table's loop is the only
// sleeper on the clock before Run starts.
func (e scheduledSetup) fireByClock(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the schedule's loop did not wait for its elapse: %v", err)
	}
	e.clock.Advance(31 * time.Second)
	start(t, e.s)
}

// scheduledRun waits for the job's run to be finished and delivered (or
// dropped as a heartbeat) and returns it.
func (e scheduledSetup) scheduledRun(t *testing.T) Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		runs, err := e.s.ListRuns(RunFilter{Agent: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) > 1 {
			t.Fatalf("%d runs, want one: %+v", len(runs), runs)
		}
		if len(runs) == 1 && Finished(runs[0].State) && runs[0].Delivered {
			r, err := e.s.GetRun(runs[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("no finished and delivered run after 30s: %+v", runs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func standup(prompt string) schedules.Job {
	return schedules.Job{
		ID: "standup", Agent: "alpha", OnCalendar: "*-*-* 09:00:00 UTC", Prompt: prompt,
		DeliverTo: schedules.Destination{Connector: "hooks", Channel: "ops", Thread: "t1"},
	}
}

func TestAScheduledJobFiresARunWhoseReplyGoesToItsDestination(t *testing.T) {
	t.Parallel()
	e := newScheduledSetup(t, standup("echo yesterday: three deploys"), nil)
	e.fireByClock(t)

	var got map[string]string
	select {
	case got = <-e.intake.got:
	case <-time.After(30 * time.Second):
		t.Fatal("intake got no reply within 30s")
	}
	if got["text"] != "yesterday: three deploys" || got["connector"] != "hooks" || got["channel"] != "ops" || got["thread"] != "t1" || got["agent"] != "alpha" {
		t.Fatalf("intake got %v, want the run's reply in hooks/ops/t1", got)
	}
	r := e.scheduledRun(t)
	if r.Schedule != "standup" || r.State != StateSucceeded || r.Backend != landlock.Name {
		t.Errorf("run = schedule %q state %q backend %q, want standup succeeded landlock", r.Schedule, r.State, r.Backend)
	}
	if want := "hooks/schedule:standup:"; !strings.HasPrefix(r.MessageID, want) {
		t.Errorf("message id = %q, want it to start with %q (one run per firing)", r.MessageID, want)
	}
	// The firing ends with its run: the listing says how it went.
	deadline := time.Now().Add(10 * time.Second)
	for {
		list := e.s.ListSchedules()
		if len(list) == 1 && list[0].LastState == string(schedules.StateSucceeded) {
			if list[0].Agent != "alpha" || list[0].Connector != "hooks" || !list[0].Next.Equal(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)) {
				t.Errorf("listed %+v", list[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedules listed %+v, want standup succeeded", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAHeartbeatThatChecksInWithHEARTBEAT_OKIsNotDelivered(t *testing.T) {
	t.Parallel()
	job := standup("")
	job.PromptFile = "HEARTBEAT.md"
	e := newScheduledSetup(t, job, func(stateDir string) {
		ws := filepath.Join(stateDir, "agents", "alpha")
		if err := os.MkdirAll(ws, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, "HEARTBEAT.md"), []byte("echo HEARTBEAT_OK"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	e.fireByClock(t)

	r := e.scheduledRun(t)
	if r.Reply != schedules.HeartbeatOK || r.Schedule != "standup" {
		t.Fatalf("run = reply %q schedule %q, want %s from standup", r.Reply, r.Schedule, schedules.HeartbeatOK)
	}
	// Marked delivered only after the delivery decision: a Deliver call
	// would be in the channel by now.
	select {
	case got := <-e.intake.got:
		t.Fatalf("intake got %v; a heartbeat's %s is not delivered", got, schedules.HeartbeatOK)
	default:
	}
}

func TestRunScheduleAndListSchedulesOverTheBus(t *testing.T) {
	t.Parallel()
	e := newScheduledSetup(t, standup("echo by hand"), nil)
	start(t, e.s)
	client := busapi.NewScheduler(e.bus.Conn(t))
	ctx := context.Background()

	if _, err := client.RunSchedule(ctx, "nope"); bus.ErrorName(err) != bus.ErrNotFound {
		t.Errorf("RunSchedule of an unknown id: %v, want %s", err, bus.ErrNotFound)
	}
	outcome, err := client.RunSchedule(ctx, "standup")
	if err != nil || outcome != string(schedules.Started) {
		t.Fatalf("RunSchedule = %q, %v; want started", outcome, err)
	}
	select {
	case got := <-e.intake.got:
		if got["text"] != "by hand" {
			t.Fatalf("intake got %v", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("intake got no reply within 30s")
	}
	list, err := client.ListSchedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != "standup" || list[0].OnCalendar != "*-*-* 09:00:00 UTC" || list[0].LastStart.IsZero() {
		t.Fatalf("ListSchedules = %+v", list)
	}
	// FireSchedule is for the timers' services, which run as root: this
	// test's own uid is the service's, so it may; a user may not.
	if out := e.bus.BusctlAs(t, "nobody", "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface, "FireSchedule", "s", "standup"); !strings.Contains(out, "Access denied") && !strings.Contains(out, "AccessDenied") {
		t.Errorf("FireSchedule as nobody answered %q, want access denied", out)
	}
}

func TestReloadGivesTheTableTheNewConfigurationsJobs(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	cfg.Schedules = []schedules.Job{standup("echo one")}
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil)
	if list := s.ListSchedules(); len(list) != 1 || list[0].ID != "standup" {
		t.Fatalf("listed %+v after New, want standup", list)
	}

	next := testConfig(4)
	nightly := standup("echo two")
	nightly.ID, nightly.OnCalendar = "nightly", "02:00 UTC"
	next.Schedules = []schedules.Job{nightly}
	s.Reload(next)
	list := s.ListSchedules()
	if len(list) != 1 || list[0].ID != "nightly" || list[0].OnCalendar != "*-*-* 02:00:00 UTC" {
		t.Fatalf("listed %+v after Reload, want nightly alone", list)
	}
	if _, err := s.TriggerSchedule("standup", schedules.Manual); !errors.Is(err, ErrNotFound) {
		t.Fatalf("firing the removed job: %v, want ErrNotFound", err)
	}
}
