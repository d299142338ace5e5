package scheduler

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testenv"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testbus"
)

// exported starts a private bus and a running scheduler that owns
// dev.berth.Scheduler1 on it.
func exported(t *testing.T) (*testbus.Bus, *Service, *gateBackend) {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	backend := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", backend, nil)
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	start(t, s)
	return b, s, backend
}

func scheduler(conn *dbus.Conn) dbus.BusObject {
	return conn.Object(bus.SchedulerName, bus.SchedulerPath)
}

// signals subscribes conn to the scheduler's signals.
func signals(t *testing.T, conn *dbus.Conn) chan *dbus.Signal {
	t.Helper()
	if err := conn.AddMatchSignal(dbus.WithMatchObjectPath(bus.SchedulerPath)); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *dbus.Signal, 100)
	conn.Signal(ch)
	return ch
}

// waitSignal returns the body of the next signal called name whose first
// argument is arg0 (any, when empty).
func waitSignal(t *testing.T, ch chan *dbus.Signal, name, arg0 string) []any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case sig := <-ch:
			if sig.Name != name {
				continue
			}
			if first, _ := sig.Body[0].(string); arg0 == "" || first == arg0 {
				return sig.Body
			}
		case <-timeout:
			t.Fatalf("no signal %s(%s) within 10s", name, arg0)
		}
	}
}

func TestDBusSurface(t *testing.T) {
	t.Parallel()
	b, _, backend := exported(t)
	client := b.Conn(t)
	sigs := signals(t, client)
	obj := scheduler(client)

	var runID string
	msg := map[string]string{"id": "m1", "agent": "alpha", "text": "hello", "connector": "hook"}
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, msg).Store(&runID); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	var again string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, msg).Store(&again); err != nil || again != runID {
		t.Fatalf("second Submit = %q, %v; want %q", again, err, runID)
	}
	if body := waitSignal(t, sigs, "dev.berth.Scheduler1.RunStateChanged", runID); body[1] != "alpha" || body[2] != StateQueued {
		t.Fatalf("RunStateChanged = %v", body)
	}
	waitSignal(t, sigs, "dev.berth.Scheduler1.RunStateChanged", runID) // running
	run := backend.next(t)

	var running uint32
	if err := obj.Call("org.freedesktop.DBus.Properties.Get", 0, bus.SchedulerInterface, "Running").Store(&running); err != nil {
		t.Fatalf("Get Running: %v", err)
	}
	if running != 1 {
		t.Fatalf("Running = %d, want 1", running)
	}

	run.reply("hi there")
	body := waitSignal(t, sigs, "dev.berth.Scheduler1.RunFinished", runID)
	if len(body) != 4 || body[2] != StateSucceeded || body[3] != "" {
		t.Fatalf("RunFinished = %v, want (run_id, agent, succeeded, no reason)", body)
	}
	for _, v := range body {
		if v == "hi there" {
			t.Fatalf("RunFinished broadcast the reply text to the whole bus: %v", body)
		}
	}

	var got map[string]dbus.Variant
	if err := obj.Call(bus.SchedulerInterface+".GetRun", 0, runID).Store(&got); err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	if got["state"].Value() != StateSucceeded || got["reply"].Value() != "hi there" || got["attempts"].Value() != uint32(1) || got["tool_calls"].Value() != "[]" {
		t.Fatalf("GetRun = %v", got)
	}
	for _, key := range []string{"id", "message_id", "agent", "reason", "error", "connector", "channel", "thread", "author", "text", "created_usec", "started_usec", "finished_usec", "delivered", "backend"} {
		if _, ok := got[key]; !ok {
			t.Errorf("GetRun has no key %q", key)
		}
	}

	// A second run, queued behind nothing, then canceled while running.
	var second string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": "m2", "agent": "alpha"}).Store(&second); err != nil {
		t.Fatal(err)
	}
	backend.next(t)
	if err := obj.Call(bus.SchedulerInterface+".CancelRun", 0, second).Err; err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	waitSignal(t, sigs, "dev.berth.Scheduler1.RunFinished", second)

	tests := []struct {
		name   string
		filter map[string]dbus.Variant
		want   []string
	}{
		{"All_runs_newest_first", map[string]dbus.Variant{}, []string{second, runID}},
		{"Filtered_by_state", map[string]dbus.Variant{"state": dbus.MakeVariant(StateCanceled)}, []string{second}},
		{"Filtered_by_agent", map[string]dbus.Variant{"agent": dbus.MakeVariant("beta")}, nil},
		{"Limited", map[string]dbus.Variant{"limit": dbus.MakeVariant(uint32(1))}, []string{second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var runs []map[string]dbus.Variant
			if err := obj.Call(bus.SchedulerInterface+".ListRuns", 0, tc.filter).Store(&runs); err != nil {
				t.Fatalf("ListRuns: %v", err)
			}
			var ids []string
			for _, r := range runs {
				ids = append(ids, r["id"].Value().(string))
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("ListRuns = %v, want %v", ids, tc.want)
			}
		})
	}

	errTests := []struct {
		name     string
		method   string
		args     []any
		wantName string
	}{
		{"Unknown_agent_is_an_invalid_argument", "Submit", []any{map[string]string{"id": "m3", "agent": "zeta"}}, bus.ErrInvalidArgument},
		{"Unknown_run_is_not_found", "GetRun", []any{"nope"}, bus.ErrNotFound},
		{"Canceling_a_finished_run_is_an_invalid_argument", "CancelRun", []any{runID}, bus.ErrInvalidArgument},
		{"Unknown_filter_key_is_an_invalid_argument", "ListRuns", []any{map[string]dbus.Variant{"colour": dbus.MakeVariant("red")}}, bus.ErrInvalidArgument},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			err := obj.Call(bus.SchedulerInterface+"."+tc.method, 0, tc.args...).Err
			if name := bus.ErrorName(err); name != tc.wantName {
				t.Fatalf("%s error = %v (%s), want %s", tc.method, err, name, tc.wantName)
			}
		})
	}
}

func TestDBusPropertiesChangeWithTheQueue(t *testing.T) {
	t.Parallel()
	b, _, backend := exported(t)
	client := b.Conn(t)
	sigs := signals(t, client)
	obj := scheduler(client)
	for _, id := range []string{"m1", "m2"} {
		if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": id, "agent": "alpha"}).Err; err != nil {
			t.Fatal(err)
		}
	}
	backend.next(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var all map[string]dbus.Variant
		if err := obj.Call("org.freedesktop.DBus.Properties.GetAll", 0, bus.SchedulerInterface).Store(&all); err != nil {
			t.Fatalf("GetAll: %v", err)
		}
		if all["QueueDepth"].Value() == uint32(1) && all["Running"].Value() == uint32(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("properties = %v, want QueueDepth 1 and Running 1", all)
		}
		time.Sleep(10 * time.Millisecond)
	}
	body := waitSignal(t, sigs, "org.freedesktop.DBus.Properties.PropertiesChanged", bus.SchedulerInterface)
	if changed, ok := body[1].(map[string]dbus.Variant); !ok || len(changed) == 0 {
		t.Fatalf("PropertiesChanged = %v", body)
	}
}

func TestDBusIntrospectionIsComplete(t *testing.T) {
	t.Parallel()
	b, _, _ := exported(t)
	var data string
	if err := scheduler(b.Conn(t)).Call("org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&data); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`interface name="dev.berth.Scheduler1"`, `method name="Submit"`, `property name="QueueDepth"`,
		`interface name="org.freedesktop.DBus.Properties"`, `interface name="org.freedesktop.DBus.Introspectable"`, `interface name="org.freedesktop.DBus.Peer"`} {
		if !strings.Contains(data, want) {
			t.Errorf("introspection lacks %s:\n%s", want, data)
		}
	}
	out, err := exec.Command("busctl", "--address="+b.Address, "tree", bus.SchedulerName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), string(bus.SchedulerPath)) {
		t.Fatalf("busctl tree = %s (%v)", out, err)
	}
}

func TestDBusSecondSchedulerCannotTakeTheName(t *testing.T) {
	t.Parallel()
	b, _, _ := exported(t)
	other := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	err := other.Export(b.Conn(t))
	if err == nil || !strings.Contains(err.Error(), "another process owns it") {
		t.Fatalf("second Export error = %v, want the name to be taken", err)
	}
}

func TestDBusUnprivilegedCallerIsRefused(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it acts as root and as user nobody")
	}
	b, s, _ := exported(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("need user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	tests := []struct {
		name string
		args []string
	}{
		{"Submit_is_refused", []string{"Submit", "a{ss}", "2", "id", "m1", "agent", "alpha"}},
		{"CancelRun_is_refused", []string{"CancelRun", "s", "x"}},
		{"GetRun_is_refused", []string{"GetRun", "s", "x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("busctl", append([]string{"--address=" + b.Address, "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface}, tc.args...)...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "Access denied") {
				t.Fatalf("busctl as nobody: %s (%v), want access denied", out, err)
			}
		})
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 0 {
		t.Fatalf("refused Submit still queued %d runs", len(runs))
	}
}
