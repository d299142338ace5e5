// Package devstack runs the whole berth suite locally, the way systemd would:
// a private system-type D-Bus daemon that loads units/dbus as installed (so
// berth-scheduler is D-Bus-activated), and berth-intake started by
// systemd-socket-activate (so it receives its listener through LISTEN_FDS,
// named "http", exactly as under berth-intake.socket). The quickstart and the
// end-to-end tests both use it, so the demo exercises the tested code path.
package devstack

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/version"
)

// Binaries are the programs Build produces. A suite's config points
// [scheduler] egress_binary at berth-egress here and egress_user at an
// unprivileged user that is not run_as (Debian's "daemon" is always there).
var Binaries = []string{"berth-intake", "berth-scheduler", "berth-imaged", "berth-egress", "berth-agent", "berthctl"}

// Build compiles the suite into binDir (created 0755 so unprivileged agent
// users can execute berth-agent). repoRoot is the module root.
func Build(repoRoot, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", binDir, err)
	}
	if err := os.Chmod(binDir, 0o755); err != nil {
		return fmt.Errorf("cannot chmod %s: %w", binDir, err)
	}
	// A dev build's version (isolation image tags carry it).
	ldflags := "-ldflags=-s -w " + version.LDFlag(version.Dev(repoRoot))
	for _, name := range Binaries {
		cmd := exec.Command("go", "build", "-trimpath", ldflags, "-o", filepath.Join(binDir, name), "./cmd/"+name)
		cmd.Dir = repoRoot
		// berth-agent goes into sandboxes and images: static.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cannot build %s: %w\n%s", name, err, out)
		}
	}
	return nil
}

// Options describes one local suite.
type Options struct {
	BinDir string // from Build
	// Dir is the suite's root: etc/berth.toml, state/, logs. Created 0755.
	Dir string
	// Config is the TOML written to Dir/etc/berth.toml.
	Config string
	// IntakeAddr is where systemd-socket-activate listens; "" picks a free
	// loopback port.
	IntakeAddr string
	// Env is extra environment for the services (e.g. BERTH_LOG_LEVEL=debug).
	Env []string
}

// Stack is a running local suite.
type Stack struct {
	Options
	Bus        *testbus.Bus
	ConfigPath string
	StateDir   string
	IntakeURL  string
	IntakeLog  string
	// BusLog is where Stop keeps the bus's log (dbus-daemon's and the
	// activated services' output) when it removes the bus's directory.
	BusLog string
	intake *exec.Cmd
}

// Start brings the suite up: the bus (scheduler activatable on it) and the
// intake socket. Nothing runs until the first request or bus call.
func Start(opts Options) (*Stack, error) {
	s := &Stack{Options: opts}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "etc"), 0o755); err != nil {
		return nil, fmt.Errorf("cannot create suite dir: %w", err)
	}
	if err := os.Chmod(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot chmod suite dir: %w", err)
	}
	s.ConfigPath = filepath.Join(opts.Dir, "etc", "berth.toml")
	if err := os.WriteFile(s.ConfigPath, []byte(opts.Config), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write config: %w", err)
	}
	s.StateDir = filepath.Join(opts.Dir, "state")
	if err := os.MkdirAll(s.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create state dir: %w", err)
	}

	b, err := testbus.StartDaemon(testbus.Options{BinDir: opts.BinDir, Env: s.serviceEnv()})
	if err != nil {
		return nil, err
	}
	s.Bus = b

	addr := opts.IntakeAddr
	if addr == "" {
		if addr, err = freeLoopbackAddr(); err != nil {
			s.Stop()
			return nil, err
		}
	}
	s.IntakeURL = "http://" + addr
	if err := s.startIntakeSocket(addr); err != nil {
		s.Stop()
		return nil, err
	}
	// The probe connection made systemd-socket-activate exec intake; return
	// once it is on the bus, so callers start from a known state.
	if err := s.WaitService(bus.IntakeName, 15*time.Second); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w (see %s)", err, s.IntakeLog)
	}
	return s, nil
}

func (s *Stack) serviceEnv() []string {
	env := []string{
		"BERTH_CONFIG=" + s.ConfigPath,
		"BERTH_STATE_DIR=" + s.StateDir,
	}
	return append(env, s.Env...)
}

// startIntakeSocket runs systemd-socket-activate, which binds addr now and
// execs berth-intake with the socket on the first connection.
func (s *Stack) startIntakeSocket(addr string) error {
	ssa, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		return fmt.Errorf("cannot find systemd-socket-activate (apt-get install systemd): %w", err)
	}
	args := []string{"--listen=" + addr, "--fdname=http"}
	for _, kv := range append(s.serviceEnv(), "DBUS_SYSTEM_BUS_ADDRESS="+s.Bus.Address, "PATH="+os.Getenv("PATH")) {
		args = append(args, "--setenv="+kv)
	}
	args = append(args, filepath.Join(s.BinDir, "berth-intake"))
	s.IntakeLog = filepath.Join(s.Dir, "intake.log")
	s.BusLog = filepath.Join(s.Dir, "bus.log")
	logFile, err := os.OpenFile(s.IntakeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("cannot open intake log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(ssa, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start systemd-socket-activate: %w", err)
	}
	s.intake = cmd
	// Wait until the socket is bound (systemd-socket-activate binds first).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			// This connection makes systemd-socket-activate exec intake;
			// closing it right away is harmless.
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("intake socket %s did not come up", addr)
}

// Sign returns the X-Berth-Timestamp and X-Berth-Signature values for body.
// The signature is HMAC-SHA256 over "<timestamp>.<body>", so a captured
// request cannot be replayed with a fresh timestamp.
func Sign(secret []byte, ts time.Time, body []byte) (timestamp, signature string) {
	return SignAt(secret, strconv.FormatInt(ts.Unix(), 10), body)
}

// SignAt signs body for an X-Berth-Timestamp value as sent.
func SignAt(secret []byte, timestamp string, body []byte) (string, string) {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(timestamp))
	mac.Write([]byte("."))
	mac.Write(body)
	return timestamp, "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Post sends a signed webhook message to intake.
func (s *Stack) Post(ctx context.Context, connector string, secret, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.IntakeURL+"/hooks/"+connector, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	ts, sig := Sign(secret, time.Now(), body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Berth-Timestamp", ts)
	req.Header.Set("X-Berth-Signature", sig)
	return http.DefaultClient.Do(req)
}

// Conn connects to the suite's bus.
func (s *Stack) Conn() (*dbus.Conn, error) {
	return dbus.Connect(s.Bus.Address)
}

// ServicePID returns the pid of the process owning a bus name (0 if none).
func (s *Stack) ServicePID(name string) (int, error) {
	conn, err := s.Conn()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var pid uint32
	err = conn.BusObject().Call("org.freedesktop.DBus.GetConnectionUnixProcessID", 0, name).Store(&pid)
	if err != nil {
		if bus.ErrorName(err) == "org.freedesktop.DBus.Error.NameHasNoOwner" {
			return 0, nil
		}
		return 0, fmt.Errorf("cannot find owner of %s: %w", name, err)
	}
	return int(pid), nil
}

// KillService sends sig to the process owning a bus name and waits until the
// name is released.
func (s *Stack) KillService(name string, sig syscall.Signal) error {
	pid, err := s.ServicePID(name)
	if err != nil {
		return err
	}
	if pid == 0 {
		return fmt.Errorf("%s is not running", name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("cannot signal %s (pid %d): %w", name, pid, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p, _ := s.ServicePID(name); p != pid {
			// Reap if it was our child's child: dbus-daemon reaps activated services.
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) did not go away after %v", name, pid, sig)
}

// Stop ends intake, the services the bus activated, and the bus.
func (s *Stack) Stop() {
	for _, name := range []string{bus.IntakeName, bus.SchedulerName, bus.ImagesName} {
		if s.Bus != nil {
			if pid, _ := s.ServicePID(name); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
				waitGone(pid, 10*time.Second)
			}
		}
	}
	if s.intake != nil && s.intake.Process != nil {
		_ = syscall.Kill(-s.intake.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.intake.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-s.intake.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	if s.Bus != nil {
		// The bus's directory goes with it: keep its log for the caller.
		if data, err := os.ReadFile(s.Bus.LogPath); err == nil {
			_ = os.WriteFile(s.BusLog, data, 0o644)
		}
		s.Bus.Stop()
	}
}

func waitGone(pid int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || zombie(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// zombie reports whether pid has exited and waits only for its parent to
// reap it (intake is our own child through systemd-socket-activate, reaped by
// Stop after this wait).
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z'
	}
	return false
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cannot find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// IntakeLauncherPID is the pid systemd-socket-activate ran as. It execs
// berth-intake on the first connection, so once intake runs, the owner of
// dev.berth.Intake1 has this very pid — proof intake got its socket by
// socket activation.
func (s *Stack) IntakeLauncherPID() int {
	if s.intake == nil || s.intake.Process == nil {
		return 0
	}
	return s.intake.Process.Pid
}

// WaitService waits until a process owns the bus name.
func (s *Stack) WaitService(name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if pid, _ := s.ServicePID(name); pid > 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear on the bus within %v", name, timeout)
}
