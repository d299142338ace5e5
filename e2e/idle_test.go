package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

// startIdleIntake starts berth-intake by hand, as its unit does, with
// --idle-exit and a watchdog, on a bus where no scheduler can be activated
// (so a posted message stays pending).
func startIdleIntake(t *testing.T, idleExit string) (addr string, notes <-chan string, done <-chan error, logs *bytes.Buffer) {
	t.Helper()
	s := start(t, []agentSpec{{id: "ops"}})
	b := testbus.Start(t, testbus.Options{})
	notifyPath, notes := notifySocket(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()

	logs = &bytes.Buffer{}
	cmd := exec.Command(filepath.Join(binDir, "berth-intake"), "--config", s.ConfigPath,
		"--state-dir", filepath.Join(s.StateDir, "idle-intake"), "--listen", addr, "--idle-exit", idleExit)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DBUS_SYSTEM_BUS_ADDRESS=" + b.Address,
		"NOTIFY_SOCKET=" + notifyPath, "WATCHDOG_USEC=200000"}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitNotify(t, notes, "READY=1")
	return addr, notes, ch, logs
}

func TestIntakePingsTheWatchdogAndExitsWithTheIdleStatusWhenNothingIsPending(t *testing.T) {
	t.Parallel()
	_, notes, done, logs := startIdleIntake(t, "1s")
	waitNotify(t, notes, "WATCHDOG=1")
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != daemon.ExitIdle {
			t.Fatalf("intake exited with %v, want exit status %d\n%s", err, daemon.ExitIdle, logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("intake did not exit after 1s idle\n%s", logs)
	}
	if !strings.Contains(logs.String(), "idle for 1s") {
		t.Fatalf("the idle exit was not logged:\n%s", logs)
	}
}

func TestIntakeWithAPendingMessageDoesNotExitWhenIdle(t *testing.T) {
	t.Parallel()
	addr, _, done, logs := startIdleIntake(t, "500ms")
	body := []byte(`{"channel":"ops","author":"tester","text":"stays pending"}`)
	ts, sig := devstack.Sign([]byte(secret), time.Now(), body)
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/hooks/hooks", addr), bytes.NewReader(body))
	req.Header.Set("X-Berth-Timestamp", ts)
	req.Header.Set("X-Berth-Signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: status %d, want 202", resp.StatusCode)
	}
	select {
	case err := <-done:
		t.Fatalf("intake exited (%v) with a message still pending\n%s", err, logs)
	case <-time.After(3 * time.Second):
	}
}
