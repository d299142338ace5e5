package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

// notifySocket is a stand-in for systemd's NOTIFY_SOCKET: it collects
// sd_notify datagrams.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("cannot listen on notify socket: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan string, 32)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(ch)
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return path, ch
}

func waitNotify(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case msg, ok := <-ch:
			if !ok {
				t.Fatalf("notify socket closed before %q", want)
			}
			if strings.Contains(msg, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q from sd_notify within 30s", want)
		}
	}
}

func TestSchedulerNotifiesSystemdAndKeepsItsConfigWhenAReloadIsBad(t *testing.T) {
	t.Parallel()
	s := start(t, []agentSpec{{id: "ops"}})
	// A second bus, so this scheduler is started by hand like Type=notify
	// would, not activated.
	b := testbus.Start(t, testbus.Options{})
	notifyPath, notes := notifySocket(t)

	var logs bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "berth-scheduler"), "--config", s.ConfigPath, "--state-dir", filepath.Join(s.StateDir, "manual"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DBUS_SYSTEM_BUS_ADDRESS=" + b.Address, "NOTIFY_SOCKET=" + notifyPath}
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitNotify(t, notes, "READY=1")

	// A bad config on reload is refused; the old one keeps serving.
	dropIn := filepath.Join(filepath.Dir(s.ConfigPath), "berth.d", "99-bad.toml")
	if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dropIn, []byte("[scheduler]\nbogus_key = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dropIn) })
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, notes, "READY=1") // after RELOADING=1
	conn := b.Conn(t)
	runID, err := busapi.NewScheduler(conn).Submit(context.Background(), busapi.Submission{MessageID: "after-bad-reload", Agent: "ops", Text: "/sh echo still-serving"})
	if err != nil || runID == "" {
		t.Fatalf("Submit after a refused reload: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, notes, "STOPPING=1")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("scheduler exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("scheduler did not exit within 30s of SIGTERM")
	}
	if !strings.Contains(logs.String(), "config refused, the running one keeps serving: "+dropIn+":2: scheduler.bogus_key") {
		t.Fatalf("the refused reload was not logged with the bad key:\n%s", logs.String())
	}
}
