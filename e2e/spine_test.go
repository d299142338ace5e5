package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

func TestSignedMessageIsAnsweredBySocketActivatedIntakeAndDBusActivatedScheduler(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})

	id := s.mustPost(t, "ops", "/sh echo hello from $(id -u)")
	reply := s.sink.wait(t, time.Minute, id)[id]

	hello, ok := agentUIDAfter(text(reply), "hello from ")
	if got := text(reply); !ok || !strings.Contains(got, "[exit code 0]") {
		t.Fatalf("reply %q: want the shell output as the agent's own uid (agent_uids) and exit code 0", got)
	}
	if reply["state"] != "succeeded" || reply["run_id"] == "" {
		t.Fatalf("reply %v: want state succeeded and a run id", reply)
	}

	// intake owns its bus name with the very pid systemd-socket-activate
	// started: it got its listener through LISTEN_FDS.
	intakePID, err := s.ServicePID(bus.IntakeName)
	if err != nil || intakePID == 0 || intakePID != s.IntakeLauncherPID() {
		t.Fatalf("intake pid %d (err %v), want the socket activator's pid %d", intakePID, err, s.IntakeLauncherPID())
	}
	// The scheduler was started by the bus (nobody else started one).
	schedPID, err := s.ServicePID(bus.SchedulerName)
	if err != nil || schedPID == 0 {
		t.Fatalf("scheduler not running on the bus: pid %d err %v", schedPID, err)
	}
	if ppid := parentPID(t, schedPID); ppid == os.Getpid() {
		t.Fatalf("scheduler's parent is the test: it was not D-Bus-activated")
	}

	if n := s.sink.attempts(id); n != 2 {
		t.Fatalf("reply was POSTed %d times; the platform refused the first, so want 2", n)
	}

	out, err := s.berthctl(t, "runs", "list", "--agent", "ops")
	if err != nil || !regexp.MustCompile(reply["run_id"].(string)+`\s+ops\s+succeeded`).MatchString(out) {
		t.Fatalf("berthctl runs list: err %v\n%s", err, out)
	}
	out, err = s.berthctl(t, "runs", "show", reply["run_id"].(string))
	if err != nil || !regexp.MustCompile(`state:\s+succeeded`).MatchString(out) || !strings.Contains(out, fmt.Sprintf("hello from %d", hello)) || !strings.Contains(out, "tool calls:\n  shell {") {
		t.Fatalf("berthctl runs show: err %v\n%s", err, out)
	}
	out, err = s.berthctl(t, "status")
	if err != nil || !strings.Contains(out, "scheduler: running") || !strings.Contains(out, "intake:    running") {
		t.Fatalf("berthctl status: err %v\n%s", err, out)
	}
}

func parentPID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("cannot read stat of %d: %v", pid, err)
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

func TestRepeatedMessageIDRunsOnce(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})
	msg := map[string]string{"id": "dup-1", "channel": "ops", "author": "a", "text": "/sh echo once"}
	for i := 0; i < 3; i++ {
		status, id := s.post(t, msg)
		if status != http.StatusAccepted || id != "dup-1" {
			t.Fatalf("post %d: status %d id %q, want 202 dup-1", i, status, id)
		}
	}
	s.sink.wait(t, time.Minute, "dup-1")
	// Once intake has nothing left to hand on or to deliver, a second run
	// could only come from a second inbox or outbox entry: there is none.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := s.intakeStatus(t)
		pending := st.InboxPending + st.OutboxPending
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intake still has %d pending entries 30s after the reply", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.sink.replies("dup-1"); n != 1 {
		t.Fatalf("%d replies for one message id, want 1", n)
	}
	runs := s.listRuns(t, busapi.ListFilter{Agent: "ops"})
	if len(runs) != 1 {
		t.Fatalf("%d runs for one message id, want 1", len(runs))
	}
}

// span runs a shell command that reports when it started and ended.
const span = `/sh a=$(date +%s%N); sleep 1; echo "span $a $(date +%s%N)"`

var spanRE = regexp.MustCompile(`span (\d+) (\d+)`)

type interval struct{ start, end int64 }

func spanOf(t *testing.T, reply map[string]any) interval {
	t.Helper()
	m := spanRE.FindStringSubmatch(text(reply))
	if m == nil {
		t.Fatalf("no span in reply %q", text(reply))
	}
	a, _ := strconv.ParseInt(m[1], 10, 64)
	b, _ := strconv.ParseInt(m[2], 10, 64)
	return interval{a, b}
}

func overlap(a, b interval) bool { return a.start < b.end && b.start < a.end }

func TestOneAgentRunsOneMessageAtATimeWhileAgentsRunInParallel(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "alpha"}, {id: "beta"}})
	// Distinct texts: identical id-less requests signed in the same second are
	// indistinguishable from a replay and run once.
	a1 := s.mustPost(t, "alpha", span+" # a1")
	a2 := s.mustPost(t, "alpha", span+" # a2")
	a3 := s.mustPost(t, "alpha", span+" # a3")
	b1 := s.mustPost(t, "beta", span+" # b1")
	got := s.sink.wait(t, 2*time.Minute, a1, a2, a3, b1)

	alpha := []interval{spanOf(t, got[a1]), spanOf(t, got[a2]), spanOf(t, got[a3])}
	for i := range alpha {
		for j := i + 1; j < len(alpha); j++ {
			if overlap(alpha[i], alpha[j]) {
				t.Fatalf("two runs of agent alpha overlapped: %v and %v", alpha[i], alpha[j])
			}
		}
	}
	// FIFO per agent: alpha's runs ran in the order they were posted.
	if !(alpha[0].end <= alpha[1].start && alpha[1].end <= alpha[2].start) {
		t.Fatalf("alpha's runs did not run in posting order: %v", alpha)
	}
	beta := spanOf(t, got[b1])
	if !overlap(beta, alpha[0]) && !overlap(beta, alpha[1]) && !overlap(beta, alpha[2]) {
		t.Fatalf("agent beta's run %v waited for alpha's %v: agents must run in parallel", beta, alpha)
	}
}

func TestSchedulerKilledWithRunsQueuedAndRunningLosesNothingAndRunsNothingTwice(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "slow"}})
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, s.mustPost(t, "slow", "/sh sleep 2; echo done-"+strconv.Itoa(i)))
	}

	// Wait until one run is running (and the others queued), then SIGKILL.
	deadline := time.Now().Add(time.Minute)
	for len(s.listRuns(t, busapi.ListFilter{State: busapi.StateRunning})) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no run started within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Nothing restarts it by itself here (systemd would: Restart=on-failure);
	// the next bus call D-Bus-activates a new scheduler, which reconciles.
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}

	got := s.sink.wait(t, 2*time.Minute, ids...)
	for i, id := range ids {
		if want := "done-" + strconv.Itoa(i); !strings.Contains(text(got[id]), want) {
			t.Fatalf("reply for message %d: %q, want %q", i, text(got[id]), want)
		}
	}
	time.Sleep(time.Second)
	for _, id := range ids {
		if n := s.sink.replies(id); n != 1 {
			t.Fatalf("message %s got %d replies, want exactly 1", id, n)
		}
	}
	runs := s.listRuns(t, busapi.ListFilter{})
	if len(runs) != len(ids) {
		t.Fatalf("%d runs for %d messages", len(runs), len(ids))
	}
	interrupted := 0
	for _, r := range runs {
		if r.Attempts == 2 {
			interrupted++
		}
	}
	if interrupted != 1 {
		t.Fatalf("%d runs were started twice, want exactly the one the kill interrupted", interrupted)
	}
}

func TestConfinedAgentCannotReadHostSecretsOtherWorkspacesOrBerthState(t *testing.T) {
	t.Parallel()
	// A connector secret kept outside the config dir, in a directory the
	// admin lets the agent read: the secret must stay out of reach.
	side, err := os.MkdirTemp(baseDir, "side-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(side, 0o755)
	secretFile := filepath.Join(side, "hook.secret")
	publicFile := filepath.Join(side, "public.txt")
	for _, f := range []string{secretFile, publicFile} {
		if err := os.WriteFile(f, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	jailExtra := fmt.Sprintf("[agents.file_access]\nallow_read = [%q]\n\n[[connectors]]\nid = \"side\"\ntype = \"webhook\"\nsecret_file = %q\n", side, secretFile)
	s := start(t, []agentSpec{{id: "jail", extra: jailExtra}, {id: "other"}, {id: "free", extra: "[agents.file_access]\nunrestricted = true"}})

	// The other agent leaves a file in its own workspace.
	id := s.mustPost(t, "other", "/sh echo other-secret > secret.txt && chmod 644 secret.txt && pwd")
	otherWS := strings.TrimSpace(strings.Split(text(s.sink.wait(t, time.Minute, id)[id]), "\n")[1])
	if !strings.HasPrefix(otherWS, s.StateDir) {
		t.Fatalf("other agent's workspace %q is not under the state dir %q", otherWS, s.StateDir)
	}
	// World-readable, so only Landlock can keep the agent out of them.
	for _, p := range []string{s.ConfigPath, otherWS, filepath.Dir(otherWS)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o004 == 0 {
			_ = os.Chmod(p, fi.Mode().Perm()|0o005)
		}
	}
	// World-writable, as the host's /tmp and /var/tmp are, but not one of
	// the run's own: only Landlock keeps the agent from writing there.
	open, err := os.MkdirTemp("/var/lib", "berth-e2e-open-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	_ = os.Chmod(open, 0o1777)
	escape := filepath.Join(open, "escape")
	targets := []string{"/etc/shadow", s.ConfigPath, filepath.Join(otherWS, "secret.txt"), filepath.Join(s.StateDir, "scheduler", "scheduler.db"), filepath.Join(s.StateDir, "intake", "intake.db"), secretFile}
	probe := "/sh for f in " + strings.Join(targets, " ") + " " + publicFile + `; do if head -c1 "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi; done; echo mine > mine.txt && cat mine.txt; echo x > ` + escape + `.$(id -u) && echo "WROTE outside"`

	jail := s.mustPost(t, "jail", probe)
	free := s.mustPost(t, "free", probe)
	got := s.sink.wait(t, time.Minute, jail, free)

	out := text(got[jail])
	for _, f := range targets {
		if !strings.Contains(out, "DENIED "+f) {
			t.Errorf("confined agent could read %s:\n%s", f, out)
		}
	}
	if !strings.Contains(out, "READ "+publicFile) {
		t.Errorf("confined agent could not read what allow_read grants:\n%s", out)
	}
	if !strings.Contains(out, "\nmine\n") {
		t.Errorf("confined agent could not write its own workspace:\n%s", out)
	}
	if strings.Contains(out, "\nWROTE outside") {
		t.Errorf("confined agent wrote outside its allowed paths:\n%s", out)
	}
	// The control: the same user without Landlock reads the world-readable
	// files, so the denials above are Landlock's doing.
	ctl := text(got[free])
	for _, f := range []string{s.ConfigPath, filepath.Join(otherWS, "secret.txt"), secretFile} {
		if !strings.Contains(ctl, "READ "+f) {
			t.Errorf("unrestricted control could not read %s, so the test proves nothing:\n%s", f, ctl)
		}
	}
	if !strings.Contains(ctl, "\nWROTE outside") {
		t.Errorf("unrestricted control could not write %s, so the test proves nothing:\n%s", open, ctl)
	}
}

func TestKernelWithoutLandlockFailsTheRunClosed(t *testing.T) {
	t.Parallel()
	// The test seam can only lower the ABI berth-agent believes it has.
	s := start(t, []agentSpec{{id: "ops"}}, "BERTH_TEST_LANDLOCK_ABI=0")
	id := s.mustPost(t, "ops", "/sh echo SHOULD-NOT-RUN")
	reply := s.sink.wait(t, time.Minute, id)[id]
	if reply["state"] != "failed" || strings.Contains(text(reply), "SHOULD-NOT-RUN") {
		t.Fatalf("reply %v: want a failed run that ran nothing", reply)
	}
	runs := s.listRuns(t, busapi.ListFilter{})
	if len(runs) != 1 || runs[0].Reason != "confinement failed" {
		t.Fatalf("runs %v: want one run failed with reason \"confinement failed\"", runs)
	}
}

func TestRefusedRequestsStoreNothingAndStartNothing(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})
	body := []byte(`{"channel":"ops","author":"a","text":"hi"}`)

	req, _ := http.NewRequest(http.MethodPost, s.IntakeURL+"/hooks/hooks", strings.NewReader(string(body)))
	req.Header.Set("X-Berth-Timestamp", strconv.FormatInt(time.Now().Unix(), 10))
	req.Header.Set("X-Berth-Signature", "sha256=00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad signature: %v %v, want 401", resp.Status, err)
	}
	resp.Body.Close()
	if status, _ := s.post(t, map[string]string{"channel": "ops", "text": "no author"}); status != http.StatusBadRequest {
		t.Fatalf("missing author: %d, want 400", status)
	}

	if inbox := s.intakeStatus(t).InboxPending; inbox != 0 {
		t.Fatalf("InboxPending = %d after refused requests, want 0", inbox)
	}
	if pid, _ := s.ServicePID(bus.SchedulerName); pid != 0 {
		t.Fatalf("a refused request started the scheduler (pid %d)", pid)
	}
}

func TestReplyIsDeliveredWhenIntakeWasNotRunning(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})
	if err := s.KillService(bus.IntakeName, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	reply := busapi.Reply{RunID: "r1", MessageID: "m1", Connector: "hooks", Channel: "ops", State: busapi.StateSucceeded, Text: "delivered while intake slept"}
	if err := s.intake(t).Deliver(context.Background(), reply); err != nil {
		t.Fatalf("Deliver with intake stopped: %v", err)
	}
	got := s.sink.wait(t, time.Minute, "m1")["m1"]
	if text(got) != "delivered while intake slept" {
		t.Fatalf("delivered %v", got)
	}
	if pid, _ := s.ServicePID(bus.IntakeName); pid == 0 || pid == s.IntakeLauncherPID() {
		t.Fatalf("intake pid %d: want a new, D-Bus-activated intake", pid)
	}
}

func TestBerthctlSendWaitsForTheReplyAndConfigCheckNamesTheBadKey(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})
	out, err := s.berthctl(t, "send", "ops", "/sh echo via-berthctl")
	if err != nil || !strings.Contains(out, "via-berthctl") {
		t.Fatalf("berthctl send: %v\n%s", err, out)
	}
	out, err = s.berthctl(t, "config", "check", "--config", s.ConfigPath, "--agent", "ops")
	if err != nil || strings.Contains(out, secret) {
		t.Fatalf("config check of a good config: %v\n%s", err, out)
	}
	bad := filepath.Join(filepath.Dir(s.ConfigPath), "bad.toml")
	if err := os.WriteFile(bad, []byte("[[agents]]\nid = \"x\"\n\n[agents.container_mode]\nnetwork = \"host\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = s.berthctl(t, "config", "check", "--config", bad)
	if err == nil || !strings.Contains(out, bad+":5:") || !strings.Contains(out, "agents[0].container_mode.network") {
		t.Fatalf("config check of a bad config: err %v, want exit 1 naming %s:5 and the key\n%s", err, bad, out)
	}
}
