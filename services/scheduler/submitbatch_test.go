package scheduler

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// exportedIdle is a scheduler on a private bus whose dispatcher has not
// started yet: what the store holds is what SubmitBatch wrote.
func exportedIdle(t *testing.T) (*testbus.Bus, *Service, *gateBackend) {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	gate := newGateBackend("landlock")
	cfg := testConfig(4)
	for i := range cfg.Agents {
		cfg.Agents[i].WorkspaceQuota = new(config.Bytes) // these runs write nothing; no quota image to mount
	}
	s := newTestService(t, cfg, "", gate, nil)
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return b, s, gate
}

func submitBatch(obj dbus.BusObject, msgs []map[string]string) (runIDs, errs []string, err error) {
	err = obj.Call(bus.SchedulerInterface+".SubmitBatch", 0, msgs).Store(&runIDs, &errs)
	return runIDs, errs, err
}

func TestSubmitBatchQueuesEveryMessageInOneCommitAndRunsAnAgentsMessagesInTheOrderGiven(t *testing.T) {
	t.Parallel()
	b, s, gate := exportedIdle(t)
	obj := scheduler(b.Conn(t))
	var msgs []map[string]string
	for i := range 6 {
		msgs = append(msgs, map[string]string{"id": fmt.Sprintf("a%d", i), "agent": "alpha", "text": fmt.Sprintf("alpha %d", i)})
		if i%2 == 0 {
			msgs = append(msgs, map[string]string{"id": fmt.Sprintf("b%d", i), "agent": "beta", "text": "beta"})
		}
	}
	before := s.store.commits()
	runIDs, errs, err := submitBatch(obj, msgs)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	if commits := s.store.commits() - before; commits != 1 {
		t.Errorf("SubmitBatch of %d messages took %d commits, want 1", len(msgs), commits)
	}
	if len(runIDs) != len(msgs) || len(errs) != len(msgs) {
		t.Fatalf("SubmitBatch returned %d run ids and %d errors for %d messages", len(runIDs), len(errs), len(msgs))
	}
	alphaRuns := map[string]string{} // run id → text
	for i, m := range msgs {
		if errs[i] != "" || runIDs[i] == "" {
			t.Fatalf("message %s: run %q, error %q; want a run", m["id"], runIDs[i], errs[i])
		}
		r, err := s.GetRun(runIDs[i])
		if err != nil || r.MessageID != m["id"] || r.Agent != m["agent"] || r.Text != m["text"] || r.State != StateQueued {
			t.Fatalf("run of %s = %+v (%v), want it queued with the message", m["id"], r, err)
		}
		if m["agent"] == "alpha" {
			alphaRuns[r.ID] = r.Text
		}
	}

	start(t, s)
	for i := 0; i < 6; {
		run := gate.next(t)
		if run.spec.AgentID != "alpha" {
			run.reply("beta done")
			continue
		}
		if got, want := alphaRuns[run.spec.RunID], fmt.Sprintf("alpha %d", i); got != want {
			t.Fatalf("alpha's run %d was %q, want %q (the batch's order)", i, got, want)
		}
		run.reply("done")
		i++
	}
}

func TestSubmitBatchRefusesBadMessagesAtTheirIndexAndQueuesTheRest(t *testing.T) {
	t.Parallel()
	b, s, _ := exportedIdle(t)
	obj := scheduler(b.Conn(t))
	msgs := []map[string]string{
		{"id": "ok-1", "agent": "alpha"},
		{"id": "lost", "agent": "zeta"},
		{"agent": "alpha"},
		{"id": "no-agent"},
		{"id": "ok-2", "agent": "alpha"},
	}
	runIDs, errs, err := submitBatch(obj, msgs)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	tests := []struct {
		name    string
		index   int
		refusal string // "" when taken
	}{
		{"A_known_agent_is_queued", 0, ""},
		{"An_unknown_agent_is_an_invalid_argument", 1, bus.ErrInvalidArgument + `: invalid argument: unknown agent "zeta"`},
		{"A_message_without_id_is_an_invalid_argument", 2, bus.ErrInvalidArgument + ": invalid argument: message has no id"},
		{"A_message_without_agent_is_an_invalid_argument", 3, bus.ErrInvalidArgument + ": invalid argument: message has no agent"},
		{"A_message_after_refused_ones_is_queued", 4, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := errs[tc.index]
			if tc.refusal == "" {
				if got != "" || runIDs[tc.index] == "" {
					t.Fatalf("run %q, error %q; want a run", runIDs[tc.index], got)
				}
				return
			}
			if !strings.HasPrefix(got, tc.refusal) || runIDs[tc.index] != "" {
				t.Fatalf("run %q, error %q; want no run and an error starting %q", runIDs[tc.index], got, tc.refusal)
			}
		})
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 2 {
		t.Fatalf("%d runs stored, want the 2 taken", len(runs))
	}
}

func TestSubmitBatchIsIdempotentPerMessageID(t *testing.T) {
	t.Parallel()
	b, s, _ := exportedIdle(t)
	obj := scheduler(b.Conn(t))
	first, _, err := submitBatch(obj, []map[string]string{{"id": "m1", "agent": "alpha"}, {"id": "m2", "agent": "beta"}, {"id": "m1", "agent": "alpha"}})
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	if first[0] != first[2] {
		t.Errorf("one message id twice in one batch got runs %s and %s, want one run", first[0], first[2])
	}
	var single string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": "m2", "agent": "beta"}).Store(&single); err != nil || single != first[1] {
		t.Errorf("Submit of a message a batch took = %q, %v; want its run %s", single, err, first[1])
	}
	again, errs, err := submitBatch(obj, []map[string]string{{"id": "m2", "agent": "beta"}, {"id": "m1", "agent": "alpha"}})
	if err != nil || again[0] != first[1] || again[1] != first[0] || errs[0] != "" || errs[1] != "" {
		t.Errorf("the batch again = %v %q (%v), want the runs %v", again, errs, err, first[:2])
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 2 {
		t.Fatalf("%d runs stored, want 2", len(runs))
	}
}

func TestSubmitBatchOfMoreThanTheLimitIsRefusedWhole(t *testing.T) {
	t.Parallel()
	b, s, _ := exportedIdle(t)
	obj := scheduler(b.Conn(t))
	msgs := make([]map[string]string, MaxBatch+1)
	for i := range msgs {
		msgs[i] = map[string]string{"id": fmt.Sprintf("m%d", i), "agent": "alpha"}
	}
	_, _, err := submitBatch(obj, msgs)
	if name := bus.ErrorName(err); name != bus.ErrInvalidArgument {
		t.Fatalf("SubmitBatch of %d = %v, want %s", len(msgs), err, bus.ErrInvalidArgument)
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 0 {
		t.Fatalf("a refused batch stored %d runs", len(runs))
	}
	empty, errs, err := submitBatch(obj, []map[string]string{})
	if err != nil || len(empty) != 0 || len(errs) != 0 {
		t.Fatalf("an empty batch = %v %v (%v), want nothing", empty, errs, err)
	}
}

func TestSubmitBatchFromAnUnprivilegedCallerIsRefused(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it acts as user nobody")
	}
	b, s, _ := exportedIdle(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("need user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	cmd := exec.Command("busctl", "--address="+b.Address, "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface,
		"SubmitBatch", "aa{ss}", "1", "2", "id", "m1", "agent", "alpha")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Access denied") {
		t.Fatalf("busctl as nobody: %s (%v), want access denied", out, err)
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 0 {
		t.Fatalf("a refused SubmitBatch queued %d runs", len(runs))
	}
}
