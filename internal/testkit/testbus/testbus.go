// Package testbus starts a private system-type dbus-daemon for tests. It loads
// berth's own policy files from units/dbus and, when asked, its activation
// files with /usr/libexec/berth/ rewritten to a directory of freshly built
// binaries — so tests exercise the files we install.
package testbus

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

// Options says what the bus activates and with which environment.
type Options struct {
	// BinDir holds berth-scheduler and berth-intake. When set, the activation
	// files of units/dbus are installed with /usr/libexec/berth/ replaced by it.
	BinDir string
	// Env is added to the environment of dbus-daemon, which passes it on to
	// the services it activates (BERTH_CONFIG, BERTH_STATE_DIR, ...).
	Env []string
}

// Bus is a running private bus.
type Bus struct {
	// Address is the bus address (unix:path=...).
	Address string
	// Dir holds the bus configuration, socket and activation files.
	Dir string
	// LogPath collects dbus-daemon's and activated services' output.
	LogPath string
	cmd     *exec.Cmd
}

// UnitsDir returns the absolute path of the repository's units/ directory.
func UnitsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "units")
}

// Start starts a bus that lives until the test ends.
func Start(t testing.TB, opts Options) *Bus {
	t.Helper()
	b, err := StartDaemon(opts)
	if err != nil {
		t.Fatalf("cannot start private D-Bus daemon: %v", err)
	}
	t.Cleanup(func() {
		b.Stop()
		if t.Failed() {
			if out, err := os.ReadFile(b.LogPath); err == nil && len(out) > 0 {
				t.Logf("dbus-daemon and activated services said:\n%s", tail(out, 8000))
			}
		}
	})
	return b
}

// StartDaemon starts a bus outside of a test (the quickstart uses it through
// scripts). Call Stop when done.
func StartDaemon(opts Options) (*Bus, error) {
	daemonPath, err := exec.LookPath("dbus-daemon")
	if err != nil {
		return nil, fmt.Errorf("cannot find dbus-daemon (apt-get install dbus): %w", err)
	}
	dir, err := os.MkdirTemp("", "berth-bus-")
	if err != nil {
		return nil, fmt.Errorf("cannot create bus dir: %w", err)
	}
	// Activated services may run as other users: let them reach the socket.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot chmod bus dir: %w", err)
	}
	b := &Bus{Dir: dir, LogPath: filepath.Join(dir, "bus.log")}
	socket := filepath.Join(dir, "system_bus_socket")
	b.Address = "unix:path=" + socket

	policyDir := filepath.Join(dir, "system.d")
	serviceDir := filepath.Join(dir, "system-services")
	for _, d := range []string{policyDir, serviceDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create %s: %w", d, err)
		}
	}
	if err := WriteUnitFiles(policyDir, serviceDir, opts.BinDir); err != nil {
		return nil, err
	}
	configPath := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(configPath, []byte(busConfig(socket, policyDir, serviceDir)), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write bus config: %w", err)
	}

	logFile, err := os.Create(b.LogPath)
	if err != nil {
		return nil, fmt.Errorf("cannot create bus log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(daemonPath, "--config-file="+configPath, "--nofork", "--print-address=1")
	cmd.Env = append(os.Environ(), "DBUS_SYSTEM_BUS_ADDRESS="+b.Address)
	cmd.Env = append(cmd.Env, opts.Env...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("cannot pipe dbus-daemon: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start dbus-daemon: %w", err)
	}
	b.cmd = cmd
	addrCh := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addrCh <- strings.TrimSpace(line)
		// Keep draining so the daemon never blocks on stdout.
		_, _ = bufio.NewReader(stdout).WriteTo(logFile)
	}()
	select {
	case addr := <-addrCh:
		if addr == "" {
			b.Stop()
			log, _ := os.ReadFile(b.LogPath)
			return nil, fmt.Errorf("dbus-daemon printed no address: %s", log)
		}
	case <-time.After(10 * time.Second):
		b.Stop()
		return nil, fmt.Errorf("dbus-daemon did not start within 10s")
	}
	return b, nil
}

// Conn opens a new private connection to the bus, closed when the test ends.
func (b *Bus) Conn(t testing.TB) *dbus.Conn {
	t.Helper()
	conn, err := dbus.Connect(b.Address)
	if err != nil {
		t.Fatalf("cannot connect to private bus: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// BusctlAs runs busctl against the bus as another (real) user, so the bus
// daemon sees that user's credentials, and returns what busctl printed.
func (b *Bus) BusctlAs(t testing.TB, username string, args ...string) string {
	t.Helper()
	u, err := user.Lookup(username)
	if err != nil {
		t.Fatalf("need user %s: %v", username, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd := exec.Command("busctl", append([]string{"--address=" + b.Address}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// Stop ends the daemon and removes its files. Services it activated are
// told to stop by losing the bus; callers stop what they started themselves.
func (b *Bus) Stop() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		_, _ = b.cmd.Process.Wait()
	}
	_ = os.RemoveAll(b.Dir)
}

// WriteUnitFiles installs units/dbus policy files into policyDir and, when
// binDir is set, the activation files into serviceDir with their Exec paths
// pointing into binDir.
func WriteUnitFiles(policyDir, serviceDir, binDir string) error {
	src := filepath.Join(UnitsDir(), "dbus")
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", src, err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return fmt.Errorf("cannot read unit file: %w", err)
		}
		var dst string
		switch filepath.Ext(e.Name()) {
		case ".conf":
			dst = filepath.Join(policyDir, e.Name())
		case ".service":
			if binDir == "" {
				continue
			}
			data = []byte(strings.ReplaceAll(string(data), "/usr/libexec/berth/", strings.TrimSuffix(binDir, "/")+"/"))
			dst = filepath.Join(serviceDir, e.Name())
		default:
			continue
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return fmt.Errorf("cannot install %s: %w", e.Name(), err)
		}
	}
	return nil
}

// busConfig is Debian's system.conf without the setuid launch helper (so
// activation execs services directly, as the invoking user), the fork, the
// pid file and syslog — plus our policy and activation directories.
func busConfig(socket, policyDir, serviceDir string) string {
	return `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <auth>EXTERNAL</auth>
  <listen>unix:path=` + socket + `</listen>
  <servicedir>` + serviceDir + `</servicedir>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus" send_member="UpdateActivationEnvironment"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
  <includedir>` + policyDir + `</includedir>
</busconfig>
`
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
