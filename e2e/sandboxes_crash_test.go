package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	boxes "github.com/berth-dev/berth/isolation/container"
)

// A scheduler SIGKILLed while three conversation sandboxes are alive leaves
// them to the next scheduler (issue 22, "Crashes"): the restarted one removes
// each (its egress proxy and pipes died with the killed process, ADR 21), so
// nothing of them is left — no process, no cgroup, no container, no record in
// scheduler.db, nothing listed — and the next message of a thread gets a
// fresh sandbox and a reply.
func TestSchedulerKilledWithThreeLiveHostSandboxesLeavesNoneBehind(t *testing.T) {
	t.Parallel()
	killedWithLiveSandboxes(t, nil, "")
}

func TestSchedulerKilledWithThreeLiveContainerSandboxesLeavesNoneBehind(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	killedWithLiveSandboxes(t, cli, containerAgent)
}

// crashSandboxAgent keeps a sandbox per thread for longer than any test,
// three of them at once: only the restart may end them.
const crashSandboxAgent = `[agents.sandbox]
scope = "conversation"
idle_stop = "1h"
max_per_agent = 3`

func killedWithLiveSandboxes(t *testing.T, cli *client.Client, extra string) {
	const agent = "keeper"
	sink := newReplySink(t)
	cfg := suiteConfig([]agentSpec{{id: agent, extra: extra + "\n" + crashSandboxAgent}}, sink.srv.URL+"/replies")
	s := startShort(t, sink, cfg)
	sched := s.scheduler(t)

	threads := []string{"t-one", "t-two", "t-three"}
	var old []busapi.Sandbox
	for _, thread := range threads {
		// A tool's background process outlives its run in a kept sandbox;
		// it must not outlive the sandbox.
		s.askInThread(t, agent, thread, "/sh sleep 600 </dev/null >/dev/null 2>&1 & echo started")
		old = append(old, liveSandboxOf(t, sched, agent, thread))
		removeLeftoversAtCleanup(t, cli, old[len(old)-1].ID)
	}

	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Meanwhile the sandboxes are still there: nobody but a new scheduler
	// can end them.
	// The host sandboxes' sleeps, which must end with them even if they
	// had left their cgroup.
	var sleeps []string
	for _, sb := range old {
		left := sandboxLeftovers(t, cli, sb.ID)
		t.Logf("left of %s while no scheduler runs: %q", sb.ID, left)
		for _, l := range left {
			if strings.HasPrefix(l, "process ") && !slices.Contains(sleeps, l) {
				sleeps = append(sleeps, l)
			}
		}
		if cli != nil && !slices.ContainsFunc(left, func(l string) bool { return strings.Contains(l, boxes.LabelKept+"=1") }) {
			t.Fatalf("no kept container of sandbox %s after the SIGKILL (%q); the test needs what a restart must remove", sb.ID, left)
		}
		if cli == nil && !slices.ContainsFunc(left, func(l string) bool { return strings.HasPrefix(l, "process ") && strings.HasSuffix(l, "(sleep 600)") }) {
			t.Fatalf("no background sleep in the cgroup of sandbox %s after the SIGKILL (%q); the test needs what a restart must remove", sb.ID, left)
		}
	}
	if ids := recordedSandboxes(t, s); len(ids) != len(old) {
		t.Fatalf("scheduler.db records %q after the SIGKILL, want the %d live sandboxes", ids, len(old))
	}

	// The next bus call D-Bus-activates a new scheduler.
	restarted := time.Now()
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}
	deadline := restarted.Add(time.Minute)
	for _, sb := range old {
		for left := sandboxLeftovers(t, cli, sb.ID); len(left) > 0; left = sandboxLeftovers(t, cli, sb.ID) {
			if time.Now().After(deadline) {
				t.Fatalf("left of sandbox %s a minute after the restart: %q", sb.ID, left)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, p := range sleeps {
		var pid int
		if _, err := fmt.Sscanf(p, "process %d ", &pid); err != nil {
			t.Fatalf("cannot read %q: %v", p, err)
		}
		for cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmdline), "sleep\x00600"); cmdline, _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s of a killed scheduler's sandbox still runs a minute after the restart", p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := sched.ListSandboxes(ctx, agent)
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	if len(list) != 0 {
		t.Fatalf("the restarted scheduler lists %+v; want none of the killed one's", list)
	}

	// A thread goes on in a fresh sandbox.
	reply := s.askInThread(t, agent, threads[0], "/sh echo after the crash")
	if !strings.Contains(text(reply), "after the crash") {
		t.Fatalf("reply %q: want the message run after the restart", text(reply))
	}
	fresh := s.runRecord(t, reply).Sandbox
	if fresh == "" || fresh == old[0].ID {
		t.Fatalf("the message after the restart ran in sandbox %q; want a fresh one (the old was %s)", fresh, old[0].ID)
	}
	removeLeftoversAtCleanup(t, cli, fresh)
	if got := liveSandboxOf(t, sched, agent, threads[0]).ID; got != fresh {
		t.Fatalf("the scheduler lists sandbox %s for %s, want %s", got, threads[0], fresh)
	}

	// scheduler.db can only be read without a scheduler holding it: kill
	// the restarted one too, then only the fresh sandbox may be recorded.
	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	recorded := recordedSandboxes(t, s)
	// A third scheduler removes the fresh one, whatever the records say:
	// the test leaves nothing.
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}
	deadline = time.Now().Add(time.Minute)
	for left := sandboxLeftovers(t, cli, fresh); len(left) > 0; left = sandboxLeftovers(t, cli, fresh) {
		if time.Now().After(deadline) {
			t.Fatalf("left of sandbox %s a minute after the second restart: %q", fresh, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(recorded, []string{fresh}) {
		t.Fatalf("scheduler.db records %q after the restart and one message; want only the fresh sandbox %s", recorded, fresh)
	}
}

// startShort is start in a directory short enough for a sandbox's egress
// socket (launchShort).
func startShort(t *testing.T, sink *replySink, cfg string) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	return launchShort(t, sink, cfg, nil, secret)
}

// askInThread posts text in thread of channel and returns its reply, which
// must have succeeded; a first container message may wait for its image.
func (s *suite) askInThread(t *testing.T, channel, thread, text string) map[string]any {
	t.Helper()
	status, id := s.post(t, map[string]string{"channel": channel, "thread": thread, "author": "tester", "text": text})
	if status != http.StatusAccepted || id == "" {
		t.Fatalf("POST %q: status %d id %q, want 202 and an id", text, status, id)
	}
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	if reply["state"] != "succeeded" {
		t.Fatalf("%q in %s: state %v error %v", text, thread, reply["state"], reply["error"])
	}
	return reply
}

// liveSandboxOf is the one sandbox the scheduler lists for thread.
func liveSandboxOf(t *testing.T, sched busapi.Scheduler, agent, thread string) busapi.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := sched.ListSandboxes(ctx, agent)
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	var found []busapi.Sandbox
	for _, sb := range list {
		if sb.Thread == thread {
			found = append(found, sb)
		}
	}
	if len(found) != 1 {
		t.Fatalf("the scheduler lists %+v for thread %s, want one sandbox", found, thread)
	}
	return found[0]
}

// sandboxLeftovers is what exists of sandbox id: its containers (any state)
// with a container backend, else its cgroups and the processes in them.
func sandboxLeftovers(t *testing.T, cli *client.Client, id string) []string {
	t.Helper()
	var left []string
	if cli != nil {
		for _, c := range containersLabelled(t, cli, boxes.LabelRun+"="+id) {
			left = append(left, fmt.Sprintf("container %s (%s, %s=%s)", c.ID[:12], c.State, boxes.LabelKept, c.Labels[boxes.LabelKept]))
		}
		return left
	}
	for _, dir := range runCgroups(id) {
		left = append(left, "cgroup "+dir)
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(procs)) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
			left = append(left, fmt.Sprintf("process %s (%s)", pid, strings.Join(strings.Fields(strings.ReplaceAll(string(cmdline), "\x00", " ")), " ")))
		}
	}
	return left
}

// removeLeftoversAtCleanup removes, when the test ends, whatever a failed
// test left of sandbox id, so that a failure leaks no container, sleep or
// cgroup to the tests after it.
func removeLeftoversAtCleanup(t *testing.T, cli *client.Client, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if cli != nil {
			for _, c := range containersLabelled(t, cli, boxes.LabelRun+"="+id) {
				_, _ = cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
			}
			return
		}
		dirs := runCgroups(id)
		for _, dir := range dirs {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, pid := range strings.Fields(string(procs)) {
				if n, err := strconv.Atoi(pid); err == nil {
					_ = syscall.Kill(n, syscall.SIGKILL)
				}
			}
		}
		for _, dir := range dirs {
			for os.Remove(dir) != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond) // until the killed processes have left it
			}
		}
	})
}

// recordedSandboxes are the sandbox ids in scheduler.db's sandboxes/
// bucket; no scheduler may be running (it holds the file's lock).
func recordedSandboxes(t *testing.T, s *suite) []string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(s.StateDir, "scheduler", "scheduler.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("cannot open scheduler.db: %v", err)
	}
	defer db.Close()
	var ids []string
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("sandboxes"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatalf("cannot read scheduler.db: %v", err)
	}
	return ids
}
