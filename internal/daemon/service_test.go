package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// probeService is a berth service that owns dev.berth.Scheduler1 and whose
// work loop fails when told to.
type probeService struct {
	fail    chan error
	reloads chan *config.Config
	closed  atomic.Bool
}

func newProbeService() *probeService {
	return &probeService{fail: make(chan error, 1), reloads: make(chan *config.Config, 4)}
}

func (p *probeService) Run(ctx context.Context) error {
	select {
	case err := <-p.fail:
		return err
	case <-ctx.Done():
		return nil
	}
}

func (p *probeService) Reload(cfg *config.Config) { p.reloads <- cfg }

func (p *probeService) Export(conn *dbus.Conn) error {
	reply, err := conn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		return errors.New("cannot own " + bus.SchedulerName)
	}
	return nil
}

func (p *probeService) Close() error { p.closed.Store(true); return nil }

func (p *probeService) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello from the probe") })
}

// probeDaemon is a running Main with its seams.
type probeDaemon struct {
	svc   *probeService
	n     *fakeNotifier
	sigs  chan os.Signal
	logs  *logBuffer
	code  chan int
	built atomic.Bool
}

func writeConfig(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "berth.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if files == nil {
		files = map[string]string{}
	}
	if _, ok := files["berth.toml"]; !ok {
		files["berth.toml"] = ""
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "berth.toml")
}

func needBus(t *testing.T) *testbus.Bus {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	testenv.NeedRoot(t) // the policy lets root own dev.berth.Scheduler1
	return testbus.Start(t, testbus.Options{})
}

// startMain runs Main for a probe service; change adjusts the spec.
func startMain(t *testing.T, b *testbus.Bus, configPath string, change func(*Spec[*probeService])) *probeDaemon {
	t.Helper()
	log, logs := testLogger()
	p := &probeDaemon{svc: newProbeService(), n: newFakeNotifier(0), sigs: make(chan os.Signal, 1), logs: logs, code: make(chan int, 1)}
	spec := Spec[*probeService]{
		Name: "berth-test", StateName: "test", Status: "probing",
		ConfigFlag: configPath, StateFlag: t.TempDir(),
		New: func(Env) (*probeService, error) {
			p.built.Store(true)
			return p.svc, nil
		},
		Seams:               Seams{Logger: log, Notifier: p.n, Signals: p.sigs},
		ActivationListeners: func(string) ([]net.Listener, error) { return nil, nil },
	}
	if b != nil {
		spec.ConnectBus = func() (*dbus.Conn, error) { return dbus.Connect(b.Address) }
	} else {
		spec.ConnectBus = func() (*dbus.Conn, error) { return nil, errors.New("no bus in this test") }
	}
	if change != nil {
		change(&spec)
	}
	go func() { p.code <- Main(spec) }()
	t.Cleanup(func() {
		select {
		case p.sigs <- syscall.SIGTERM:
		default:
		}
	})
	return p
}

func (p *probeDaemon) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case c := <-p.code:
		return c
	case <-time.After(15 * time.Second):
		t.Fatalf("Main did not return within 15s; log: %q", p.logs.messages())
		return -1
	}
}

func nameHasOwner(t *testing.T, conn *dbus.Conn, name string) bool {
	t.Helper()
	var has bool
	if err := conn.BusObject().Call("org.freedesktop.DBus.NameHasOwner", 0, name).Store(&has); err != nil {
		t.Fatalf("NameHasOwner: %v", err)
	}
	return has
}

func TestMainExitsWithStatus1AndLeavesTheBusWhenTheWorkLoopFails(t *testing.T) {
	t.Parallel()
	b := needBus(t)
	observer := b.Conn(t)
	p := startMain(t, b, writeConfig(t, nil), nil)
	p.n.await(t, "READY=1")
	if !nameHasOwner(t, observer, bus.SchedulerName) {
		t.Fatal("the service does not own its name while serving")
	}
	if err := observer.AddMatchSignal(dbus.WithMatchInterface("org.freedesktop.DBus"), dbus.WithMatchMember("NameOwnerChanged"),
		dbus.WithMatchArg(0, bus.SchedulerName)); err != nil {
		t.Fatal(err)
	}
	owners := make(chan *dbus.Signal, 4)
	observer.Signal(owners)
	p.svc.fail <- errors.New("cannot reconcile runs: record 7 is undecodable")
	if code := p.exitCode(t); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	want := "berth-test exits with status 1: the work loop ended: cannot reconcile runs: record 7 is undecodable"
	if len(p.logs.messagesContaining(want)) != 1 {
		t.Fatalf("the log does not say %q: %q", want, p.logs.messages())
	}
	// The bus daemon drops the name once it has seen the connection close.
	select {
	case sig := <-owners:
		if len(sig.Body) != 3 || sig.Body[2] != "" {
			t.Fatalf("NameOwnerChanged %v, want the name released", sig.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the name is still owned after the work loop failed: calls would reach a daemon without work")
	}
	if nameHasOwner(t, observer, bus.SchedulerName) {
		t.Fatal("the name has an owner after it was released")
	}
	if !p.svc.closed.Load() {
		t.Fatal("the service was not closed")
	}
}

func TestMainRefusesABadConfigAtStartNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, nil)
	bad := filepath.Join(filepath.Dir(path), "berth.d", "10-x.toml")
	if err := os.WriteFile(bad, []byte("[[agents]]\nid = \"ops\"\n[agents.container_mode]\n\n\n\nnetwork = \"host\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startMain(t, nil, path, nil)
	if code := p.exitCode(t); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	want := "config refused: " + bad + ":7: agents[0].container_mode.network: "
	if len(p.logs.messagesContaining(want)) != 1 {
		t.Fatalf("no log message starting %q: %q", want, p.logs.messages())
	}
	if len(p.logs.messagesContaining("berth-test exits with status 1: cannot start with the config in "+path)) != 1 {
		t.Fatalf("the exit is not explained: %q", p.logs.messages())
	}
	if p.built.Load() || len(p.n.Sent()) != 0 {
		t.Fatalf("a refused config built the service (%v) or notified %q", p.built.Load(), p.n.Sent())
	}
}

func TestMainKeepsTheRunningConfigWhenAReloadIsRefused(t *testing.T) {
	t.Parallel()
	b := needBus(t)
	path := writeConfig(t, nil)
	dropIns := filepath.Join(filepath.Dir(path), "berth.d")
	p := startMain(t, b, path, nil)
	p.n.await(t, "READY=1")

	bad := filepath.Join(dropIns, "99-bad.toml")
	if err := os.WriteFile(bad, []byte("[scheduler]\nbogus_key = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.sigs <- syscall.SIGHUP
	p.n.await(t, "RELOADING=1")
	// READY comes after the reload was refused or applied.
	if status := p.n.await(t, "READY=1"); !strings.Contains(status, "last reload refused: "+bad+":2: scheduler.bogus_key") {
		t.Fatalf("systemctl status would show %q, want the refused file, line and key", status)
	}
	select {
	case cfg := <-p.svc.reloads:
		t.Fatalf("the service was given the refused config %v", cfg.Sources)
	default:
	}
	want := "config refused, the running one keeps serving: " + bad + ":2: scheduler.bogus_key: unknown key"
	if len(p.logs.messagesContaining(want)) != 1 {
		t.Fatalf("no log message %q: %q", want, p.logs.messages())
	}

	good := filepath.Join(dropIns, "50-good.toml")
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("[[agents]]\nid = \"ops\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.sigs <- syscall.SIGHUP
	p.n.await(t, "RELOADING=1")
	if status := p.n.await(t, "READY=1"); status != "READY=1\nSTATUS=probing" {
		t.Fatalf("after a good reload the status is %q", status)
	}
	select {
	case cfg := <-p.svc.reloads:
		if !slices.Contains(cfg.Sources, good) {
			t.Fatalf("the service got a config from %v, want one with %s", cfg.Sources, good)
		}
	default:
		t.Fatal("the accepted config did not reach the service")
	}
	p.sigs <- syscall.SIGTERM
	if code := p.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0", code)
	}
}

func TestMainServesHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		activated bool
	}{
		{name: "On_the_socket_systemd_passed", activated: true},
		{name: "On_its_own_address_when_not_socket_activated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := needBus(t)
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			if !tc.activated {
				l.Close()
			}
			p := startMain(t, b, writeConfig(t, nil), func(s *Spec[*probeService]) {
				s.HTTP = (*probeService).Handler
				s.Listen = func(*config.Config) string { return addr }
				if tc.activated {
					s.ActivationListeners = func(name string) ([]net.Listener, error) {
						if name != "http" {
							return nil, errors.New("asked for socket " + name)
						}
						return []net.Listener{l}, nil
					}
				}
			})
			p.n.await(t, "READY=1")
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "hello from the probe" {
				t.Fatalf("GET / = %q", body)
			}
			p.sigs <- syscall.SIGTERM
			if code := p.exitCode(t); code != 0 {
				t.Fatalf("exit status %d, want 0", code)
			}
		})
	}
}

func TestARefusedConfigIsLoggedWithoutTheSecretsInIt(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-hook-key-4711"
	tests := []struct{ name, text string }{
		{name: "A_secret_under_a_misspelt_key", text: "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecert = \"" + secret + "\"\n"},
		{name: "A_secret_followed_by_garbage", text: "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = \"" + secret + "\" x\n"},
		{name: "A_secret_without_quotes", text: "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = " + secret + "\n"},
		{name: "A_token_of_the_wrong_type", text: "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = [\"" + secret + "\"]\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tc.text})
			p := startMain(t, nil, path, nil)
			if code := p.exitCode(t); code != 1 {
				t.Fatalf("exit status %d, want 1", code)
			}
			if len(p.logs.messagesContaining("config refused: "+path+":4")) == 0 {
				t.Fatalf("the refusal does not name %s:4: %q", path, p.logs.messages())
			}
			p.logs.mu.Lock()
			all := p.logs.buf.String()
			p.logs.mu.Unlock()
			if strings.Contains(all, secret) {
				t.Fatalf("the log holds the secret:\n%s", all)
			}
		})
	}
}
