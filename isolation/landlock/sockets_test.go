package landlock_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

// listenUnix listens on a named socket anyone may connect to (DAC would let
// a tool in) and accepts until the test ends.
func listenUnix(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// A tool of a confined host run cannot connect to the host's named Unix
// sockets under /run — a service's, a D-Bus bus's, the system bus's —
// since /run is an empty tmpfs in the run's mount namespace; a socket in a
// directory the plan names stays reachable. An unrestricted run of the same
// tools reaches all of them, so the masks are what stops the confined one.
func TestToolsCannotReachTheHostsNamedSockets(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	dir := runDir(t, "berth-test-sockets-")
	service := filepath.Join(dir, "service.sock")
	listenUnix(t, service)
	bus := startBus(t, dir)
	allowed := runDir(t, "berth-test-allowed-")
	allowedSocket := filepath.Join(allowed, "allowed.sock")
	listenUnix(t, allowedSocket)

	probes := []struct {
		name     string
		what     string // the probe's command, as its line starts
		confined string // how the line ends in a confined run
	}{
		{"A_service_socket_under_run_is_gone", "connect " + service, "no such file or directory"},
		{"A_D-Bus_bus_under_run_is_gone", "dbus " + bus, "no such file or directory"},
		{"A_socket_in_a_directory_the_plan_names_stays_reachable", "connect " + allowedSocket, " ok"},
	}
	if _, err := os.Stat("/run/dbus/system_bus_socket"); err == nil {
		probes = append(probes, struct{ name, what, confined string }{"The_system_bus_is_gone", "connect /run/dbus/system_bus_socket", "no such file or directory"})
	}
	var commands []string
	for _, p := range probes {
		commands = append(commands, "sysprobe "+p.what)
	}
	command := strings.Join(commands, "; ")
	confinedReply := toolRun(t, confined, command, nil, allowed)
	controlReply := toolRun(t, unconfined, command, nil)
	for _, p := range probes {
		t.Run(p.name, func(t *testing.T) {
			if got := probeLine(confinedReply, p.what); !strings.HasSuffix(got, p.confined) {
				t.Errorf("confined run: %q, want it to end in %q\nreply:\n%s", got, p.confined, confinedReply)
			}
			if got := probeLine(controlReply, p.what); !strings.HasSuffix(got, " ok") && !strings.Contains(got, "names) ok") {
				t.Errorf("unrestricted run (the control): %q, want it to get through\nreply:\n%s", got, controlReply)
			}
		})
	}
}

// A run whose egress socket directory lies under /run (egress_dir set
// there) still finds it: the plan's socket directory is bound back into the
// masked /run.
func TestTheEgressSocketDirectoryStaysReachableUnderAMaskedRun(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	dir := runDir(t, "berth-test-egress-")
	socket := filepath.Join(dir, "egress.sock")
	listenUnix(t, socket)
	reply := toolRun(t, confined, "sysprobe connect "+socket+"; sysprobe connect "+filepath.Join(filepath.Dir(dir), "docker.sock"), func(s *isolation.Spec) {
		// Only the directory matters here; the egress socket path is what
		// the runner keeps visible.
		s.AgentBinary = staticBerthAgent(t)
		s.Egress = &isolation.EgressPlan{Socket: socket, SandboxSocket: socket, ProxyAddr: "127.0.0.1:3128"}
		s.EgressToken = "tok-0123456789abcdef"
		s.Policy = isolation.KeepReadable(s.Policy, dir)
	})
	if got := probeLine(reply, "connect "+socket); !strings.HasSuffix(got, " ok") {
		t.Errorf("the run's egress socket: %q, want ok\nreply:\n%s", got, reply)
	}
	if got := probeLine(reply, "connect /run/docker.sock"); !strings.Contains(got, "refused") {
		t.Errorf("another socket next to it: %q, want refused", got)
	}
}
