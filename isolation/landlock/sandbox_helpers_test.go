package landlock_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
	"github.com/berth-dev/berth/isolation/unrestricted"
)

// sysprobe is testdata/sysprobe, what a hostile tool runs, built once.
var sysprobe struct {
	once sync.Once
	path string
	err  error
}

func sysprobeBinary(t *testing.T) string {
	t.Helper()
	sysprobe.once.Do(func() {
		dir, err := os.MkdirTemp(base, "sysprobe-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			sysprobe.err = err
			return
		}
		sysprobe.path, sysprobe.err = testenv.Build(dir, "sysprobe", "./testdata/sysprobe")
	})
	if sysprobe.err != nil {
		t.Fatal(sysprobe.err)
	}
	return sysprobe.path
}

// staticAgent is berth-agent built as it ships (CGO_ENABLED=0): its egress
// set-up changes every thread's capabilities, which a cgo build cannot.
var staticAgent struct {
	once sync.Once
	path string
	err  error
}

func staticBerthAgent(t *testing.T) string {
	t.Helper()
	staticAgent.once.Do(func() {
		staticAgent.path, staticAgent.err = testenv.BuildStatic(base, "berth-agent-static", "github.com/berth-dev/berth/cmd/berth-agent")
	})
	if staticAgent.err != nil {
		t.Fatal(staticAgent.err)
	}
	return staticAgent.path
}

// backendKind says which host backend a toolRun uses.
type backendKind int

const (
	confined backendKind = iota
	unconfined
)

// toolRun runs command as a shell tool of the real berth-agent, as nobody,
// through the landlock backend (confined) or the unrestricted one, and
// returns the reply. The policy allows reading the probe and readable.
func toolRun(t *testing.T, kind backendKind, command string, edit func(*isolation.Spec), readable ...string) string {
	t.Helper()
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	probe := sysprobeBinary(t)
	s := spec(t, berthAgent, "/sh "+strings.ReplaceAll(command, "sysprobe ", probe+" "))
	s.Request.Workspace = s.Workspace
	s.Policy = isolation.HostPolicy(isolation.FileAccess{AllowRead: append([]string{probe}, readable...)}, s.Workspace, nil)
	if kind == unconfined {
		s.Policy = isolation.HostPolicy(isolation.FileAccess{Unrestricted: true}, s.Workspace, nil)
	}
	if edit != nil {
		edit(&s)
	}
	var b isolation.Backend = landlock.New()
	if kind == unconfined {
		b = unrestricted.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	res, err := b.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v\nstderr: %s", err, res.Stderr)
	}
	return res.Response.Reply
}

// runDir makes a directory under /run that every user may enter, as a
// service's socket directory is; it is removed when the test ends.
func runDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", prefix)
	if err != nil {
		t.Fatalf("cannot make a directory under /run: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startBus starts a private system-type dbus-daemon that anyone may use,
// listening on dir/bus, and returns the socket's path once it listens.
func startBus(t *testing.T, dir string) string {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is missing: %v", err)
	socket := filepath.Join(dir, "bus")
	conf := filepath.Join(dir, "bus.conf")
	err = os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=`+socket+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow receive_type="method_return"/>
    <allow receive_type="signal"/>
  </policy>
</busconfig>
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start dbus-daemon: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- line
	}()
	select {
	case line := <-lines:
		if !strings.Contains(line, socket) {
			t.Fatalf("dbus-daemon printed address %q, want one on %s", line, socket)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("dbus-daemon printed no address")
	}
	return socket
}

// waitFor waits until path exists (what a tool writes to say it got there).
func waitFor(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
	}
}

// probeLine is the line sysprobe printed for what in reply.
func probeLine(reply, what string) string {
	for _, line := range strings.Split(reply, "\n") {
		if strings.HasPrefix(line, what+" ") {
			return line
		}
	}
	return fmt.Sprintf("(no line for %q)", what)
}
