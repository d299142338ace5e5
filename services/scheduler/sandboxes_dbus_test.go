package scheduler

import (
	"context"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The sandboxes are listed and stopped over the bus (root and berth-admin;
// nobody is refused), and SandboxesChanged says when to list again.
func TestSandboxesAreListedAndStoppedOverTheBus(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	clock := clockwork.NewFakeClock()
	s := sandboxService(t, sandboxConfig(t, time.Hour, 3), sandboxStateDir(t), clock)
	t.Cleanup(func() { s.Close() })
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	start(t, s)
	client := b.Conn(t)
	sigs := signals(t, client)
	sched := busapi.NewScheduler(client)
	ctx := context.Background()

	run := succeeded(t, s, submit(t, s, "bus-m1", "alpha", "text", "/sh echo hi", "channel", "C 1", "thread", "thread/ä"))
	waitSandboxesChanged(t, sigs)
	list, err := sched.ListSandboxes(ctx, "alpha")
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	if len(list) != 1 || list[0].ID != run.Sandbox || list[0].Channel != "C 1" || list[0].Thread != "thread/ä" || list[0].Runs != 1 ||
		list[0].Backend != "landlock" || list[0].Busy || list[0].Started.IsZero() || list[0].MemoryBytes == 0 {
		t.Fatalf("ListSandboxes = %+v; want the run's sandbox %s, its conversation verbatim, 1 run, its memory", list, run.Sandbox)
	}
	if got, err := sched.GetRun(ctx, run.ID); err != nil || got.Sandbox != run.Sandbox {
		t.Errorf("GetRun = sandbox %q, %v; want the run's sandbox %s", got.Sandbox, err, run.Sandbox)
	}
	if other, err := sched.ListSandboxes(ctx, "beta"); err != nil || len(other) != 0 {
		t.Errorf("ListSandboxes(beta) = %+v, %v; want none", other, err)
	}

	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("need user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	for _, args := range [][]string{{"ListSandboxes", "s", ""}, {"StopSandbox", "s", run.Sandbox}} {
		cmd := exec.Command("busctl", append([]string{"--address=" + b.Address, "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Access denied") {
			t.Errorf("busctl %s as nobody: %s (%v), want access denied", args[0], out, err)
		}
	}

	if err := sched.StopSandbox(ctx, "sbx_nope"); bus.ErrorName(err) != bus.ErrNotFound {
		t.Errorf("StopSandbox of an unknown id = %v, want %s", err, bus.ErrNotFound)
	}
	if err := sched.StopSandbox(ctx, run.Sandbox); err != nil {
		t.Fatalf("StopSandbox: %v", err)
	}
	if list, err := sched.ListSandboxes(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("after StopSandbox: %+v, %v; want none", list, err)
	}
	if ids := recordedSandboxes(t, s); len(ids) != 0 {
		t.Errorf("sandboxes/ still holds %v after StopSandbox", ids)
	}
}

// waitSandboxesChanged waits for the next SandboxesChanged signal.
func waitSandboxesChanged(t *testing.T, ch chan *dbus.Signal) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case sig := <-ch:
			if sig.Name == bus.SchedulerInterface+".SandboxesChanged" {
				return
			}
		case <-timeout:
			t.Fatal("no SandboxesChanged within 30s")
		}
	}
}
