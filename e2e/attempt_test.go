package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	boxes "github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/services/scheduler"
)

// The scheduler is SIGKILLed, under CPU load, in the two windows a crash
// used to leave a run's sandbox behind in: after the sandbox exists but
// before its handle is committed (only a sweep can find it), and after the
// commit but before the answer. The restarted scheduler runs the message
// again as attempt 2 (same run id) while nothing of attempt 1 is left: no
// container, no cgroup, no egress directory; the reply comes once.
func TestSchedulerKilledDuringAContainerRunLeavesNoContainerBehind(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	for _, point := range []string{scheduler.HoldBeforeHandle, scheduler.HoldBeforeAnswer} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			killedMidAttempt(t, cli, point, containerAgent)
		})
	}
}

func TestSchedulerKilledDuringAHostRunLeavesNoCgroupBehind(t *testing.T) {
	t.Parallel()
	killedMidAttempt(t, nil, scheduler.HoldBeforeAnswer, "")
}

// killedMidAttempt runs one message of an agent (a container agent when cli
// is set) that reaches the network only through its egress proxy, kills the
// scheduler at point of the first attempt, and checks the restart.
func killedMidAttempt(t *testing.T, cli *client.Client, point, extra string) {
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	hogCPU(t, 2)
	hold := holdDir(t)
	if err := os.WriteFile(filepath.Join(hold, point), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	agent := "crash"
	extra = "[agents.egress]\nallow = [\"example.invalid\"]\n" + extra
	cfg := strings.Replace(suiteConfig([]agentSpec{{id: agent, extra: extra}}, "REPLY_URL"), "[scheduler]\n", "[scheduler]\negress_user = \"daemon\"\n", 1)
	sink := newReplySink(t)
	cfg = strings.Replace(cfg, "REPLY_URL", sink.srv.URL+"/replies", 1)
	s := launchShort(t, sink, cfg, []string{"BERTH_TEST_HOLD_DIR=" + hold}, secret)
	id := s.mustPost(t, agent, "/sh sleep 3; echo survived")

	run, attempt := waitHeld(t, hold, point)
	if attempt != 1 {
		t.Fatalf("held at attempt %d, want the first", attempt)
	}
	dead := isolation.AttemptName(run, 1)
	egressDir := filepath.Join(s.StateDir, "scheduler", "egress", dead)
	leftovers := func() []string {
		var left []string
		if _, err := os.Stat(egressDir); err == nil {
			left = append(left, "egress directory "+egressDir)
		}
		if cli != nil {
			for _, c := range containersLabelled(t, cli, boxes.LabelRun+"="+run) {
				if c.Labels[boxes.LabelAttempt] == "1" {
					left = append(left, fmt.Sprintf("container %s (%s)", c.ID[:12], c.State))
				}
			}
		} else {
			for _, dir := range runCgroups(dead + ".") {
				left = append(left, "cgroup "+dir)
			}
		}
		return left
	}
	// The test is only worth something if attempt 1 had made them all.
	if left := leftovers(); len(left) < 2 || !strings.HasPrefix(left[0], "egress directory") {
		t.Fatalf("at %s attempt 1 has %q; want its egress directory and its sandbox (container or cgroups)", point, left)
	}
	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The next bus call D-Bus-activates a new scheduler.
	restarted := time.Now()
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}
	reply := text(s.sink.wait(t, 3*time.Minute, id)[id])
	if !strings.Contains(reply, "survived") {
		t.Fatalf("reply %q: want the interrupted message run again", reply)
	}
	r := s.getRun(t, run)
	if r.Attempts != 2 || r.State != busapi.StateSucceeded {
		t.Fatalf("run %s is %s after %d attempts; want succeeded in the second", run, r.State, r.Attempts)
	}
	// The sweep at start removes them (bounded by 30 s), well before the
	// next periodic sweep (2 minutes) could.
	deadline := restarted.Add(time.Minute)
	for left := leftovers(); len(left) > 0; left = leftovers() {
		if time.Now().After(deadline) {
			t.Fatalf("left of the killed attempt a minute after the restart: %q", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline = time.Now().Add(time.Minute)
	if cli != nil {
		for len(containersLabelled(t, cli, boxes.LabelRun+"="+run)) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("containers of the run left behind after its reply")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if n := s.sink.replies(id); n != 1 {
		t.Fatalf("%d replies stored for the message, want 1", n)
	}
}

// holdDir is where the test arms a scheduler.HoldAtFiles point and learns
// that a start reached it.
func holdDir(t *testing.T) string {
	dir, err := os.MkdirTemp(baseDir, "hold-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitHeld waits until a start reached point and returns its run and
// attempt.
func waitHeld(t *testing.T, dir, point string) (string, int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, point+".reached")); err == nil && strings.HasSuffix(string(b), "\n") {
			var run string
			var attempt int
			if _, err := fmt.Sscanf(string(b), "%s %d", &run, &attempt); err != nil {
				t.Fatalf("%s.reached holds %q: %v", point, b, err)
			}
			return run, attempt
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start reached %s within 3 minutes", point)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runCgroups are the run cgroups (berth-runs/<prefix>…) under any
// hierarchy.
func runCgroups(prefix string) []string {
	var found []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if filepath.Base(filepath.Dir(path)) == "berth-runs" {
			if strings.HasPrefix(d.Name(), prefix) {
				found = append(found, path)
			}
			return fs.SkipDir
		}
		return nil
	})
	return found
}

// hogCPU keeps n processes spinning for the test's duration: the crash
// windows are hit under load, as in the full suite.
func hogCPU(t *testing.T, n int) {
	for range n {
		cmd := exec.Command("yes")
		if err := cmd.Start(); err != nil {
			t.Fatalf("cannot start a CPU hog: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
