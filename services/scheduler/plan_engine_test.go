package scheduler

import (
	"context"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"os/exec"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/landlock"
)

func TestAHungEngineFailsContainerRunsInTimeAndFreezesNothingElse(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	const engineTimeout = 3 * time.Second
	cli, err := client.New(client.WithHost(testdocker.HungEngine(t)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	stateDir := sharedStateDir(t)
	boxes, err := container.New(container.Options{Client: cli, Instance: stateDir, EngineTimeout: engineTimeout, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	enabled := true
	cfg := config.Defaults()
	cfg.Agents = []config.AgentSettings{
		{ID: "boxed", ContainerMode: config.ContainerSettings{Enabled: &enabled}},
		{ID: "ops"},
	}
	cfg.Scheduler.DefaultTimeout, cfg.Scheduler.RunAs, cfg.Scheduler.AgentBinary = time.Minute, "nobody", testAgent(t)
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New(), container.Name: boxes},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	obj := b.Conn(t).Object(bus.SchedulerName, bus.SchedulerPath)

	began := time.Now()
	boxed := submit(t, s, "m-boxed", "boxed", "text", "echo from a box")
	ops := submit(t, s, "m-ops", "ops", "text", "echo from the host")
	start(t, s)

	// The landlock run finishes while the container run is still stuck in
	// its first engine call.
	if r := waitFinished(t, s, ops); r.State != StateSucceeded || r.Reply != "from the host" {
		t.Fatalf("landlock run = %q %q %q, want it to succeed beside a hung engine", r.State, r.Reason, r.Error)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var run map[string]dbus.Variant
	if err := obj.CallWithContext(ctx, bus.SchedulerInterface+".GetRun", 0, boxed).Store(&run); err != nil {
		t.Fatalf("GetRun did not answer beside a hung engine: %v", err)
	}
	if state, _ := run["state"].Value().(string); state != StateRunning && time.Since(began) < engineTimeout {
		t.Errorf("container run is %q before its engine deadline, want running", state)
	}
	var runs []map[string]dbus.Variant
	if err := obj.CallWithContext(ctx, bus.SchedulerInterface+".ListRuns", 0, map[string]dbus.Variant{}).Store(&runs); err != nil || len(runs) != 2 {
		t.Fatalf("ListRuns beside a hung engine: %d runs, %v", len(runs), err)
	}

	r := waitFinished(t, s, boxed)
	if r.State != StateFailed || r.Reason != isolation.ReasonEngineUnavailable {
		t.Fatalf("container run = %q %q %q, want failed with %q", r.State, r.Reason, r.Error, isolation.ReasonEngineUnavailable)
	}
	if took := r.FinishedAt.Sub(began); took > 4*engineTimeout {
		t.Errorf("the container run took %s to fail, its engine deadline is %s", took, engineTimeout)
	}
}
