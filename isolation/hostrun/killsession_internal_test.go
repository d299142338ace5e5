package hostrun

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// exitedLeader starts a session leader that exits at once and waits until
// it is a zombie (exited, not reaped), the state Wait finds it in.
func exitedLeader(tb testing.TB) (*exec.Cmd, uint64) {
	tb.Helper()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("cannot start /bin/true: %v", err)
	}
	start, err := startTime(cmd.Process.Pid)
	if err != nil {
		tb.Fatalf("cannot read start time: %v", err)
	}
	waitExited(cmd.Process.Pid)
	return cmd, start
}

func TestKillingTheSessionOfAnExitedAgentReturnsAtOnce(t *testing.T) {
	t.Parallel()
	cmd, start := exitedLeader(t)
	rounds := killSessionRounds(cmd.Process.Pid, start)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the agent's exit status was lost: %v", err)
	}
	// A zombie leader counted as alive costs 10 rounds of 10 ms sleeps:
	// the rounds are counted, not timed, so a loaded machine cannot fail it.
	if rounds != 0 {
		t.Fatalf("killing the session of an exited leader took %d rounds of sleep; a zombie must not count as a live process", rounds)
	}
}

func TestKillingASessionStillEndsItsLiveProcesses(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start sh: %v", err)
	}
	start, err := startTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killSession(cmd.Process.Pid, start)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's processes survived killSession")
	}
}

// BenchmarkSessionKillAfterNormalExit is the per-run cost of ending what a
// normally exited agent left in its session (nothing, here).
func BenchmarkSessionKillAfterNormalExit(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		cmd, start := exitedLeader(b)
		b.StartTimer()
		killSession(cmd.Process.Pid, start)
		b.StopTimer()
		cmd.Wait()
		b.StartTimer()
	}
}
