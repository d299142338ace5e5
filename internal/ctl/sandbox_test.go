package ctl

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/landlock"
	"github.com/berth-dev/berth/services/scheduler"
)

// schedulerOnBus starts a private bus with a scheduler on it that loaded
// configText and sees env as its environment, and returns a connection for
// berthctl and the scheduler's state dir.
func schedulerOnBus(t *testing.T, configText string, env map[string]string) (*dbus.Conn, string) {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(configText), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	// Short, like a real state dir: egress sockets live under it and their
	// paths must fit a Unix socket address (t.TempDir's names do not).
	stateDir, err := os.MkdirTemp("", "ctl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	boxes, err := container.New(container.Options{Instance: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(cfg, stateDir, scheduler.Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New(), container.Name: boxes},
		Getenv:   func(k string) string { return env[k] },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	return b.Conn(t), stateDir
}

// berthctl runs a berthctl command on conn and returns its output and exit
// code.
func berthctl(conn *dbus.Conn, args ...string) (string, int) {
	var out, errOut bytes.Buffer
	c := &cli{out: &out, errOut: &errOut, conn: conn}
	var err error
	switch args[0] {
	case "sandbox":
		err = c.sandbox(args[1:])
	case "providers":
		err = c.providers(args[1:])
	case "egress":
		err = c.egress(args[1:])
	}
	var ee *exitErr
	var ue *usageErr
	switch {
	case err == nil:
		return out.String(), ExitOK
	case errors.As(err, &ee):
		return out.String() + errOut.String() + err.Error(), ee.code
	case errors.As(err, &ue):
		return err.Error(), ExitUsage
	}
	return out.String() + err.Error(), ExitFailed
}

const sandboxConfig = `[scheduler]
run_as = "nobody"

[providers]
primary = "cloud"
[providers.cloud]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CLOUD_KEY"

[[agents]]
id = "boxed"
provider = "local"
[agents.container_mode]
enabled = true
network = "none"
memory_limit = "256m"
runtime = "runc"
binds = ["/srv/data:/data:ro"]
warm = 2

[[agents]]
id = "ops"
[agents.file_access]
allow_read = ["/var/log"]
allow_network = true

[[agents]]
id = "offline"
[agents.file_access]
allow_network = false
`

const sandboxSecret = "sk-sandbox-SECRET-1234"

func TestSandboxExplainShowsTheSchedulersOwnPlanAndWhy(t *testing.T) {
	t.Parallel()
	conn, stateDir := schedulerOnBus(t, sandboxConfig, map[string]string{"CLOUD_KEY": sandboxSecret})
	tests := []struct {
		name  string
		args  []string
		code  int
		want  []string
		never []string
	}{
		{"A_container_agent_shows_image_limits_network_mounts_user_and_runtime", []string{"boxed"}, ExitOK, []string{
			"backend:   container — container_mode.enabled = true", "image:     berth-agent:<content hash>",
			"runtime:   runc", "memory 256m with no extra swap, 256 pids, 1 CPU, tmpfs /tmp 256m", "network:   none",
			"→ /workspace (rw)", "/srv/data → /data (ro)", "confined:  container", "holds: NetworkMode=none", "user:      uid 18790", "allocated from [scheduler] agent_uids", "warm:      2 started container(s) kept waiting on stdin"}, nil},
		{"A_landlock_agent_shows_its_policy_and_what_protects_the_others", []string{"ops"}, ExitOK, []string{
			"backend:   landlock", "read-write: " + filepath.Join(stateDir, "agents", "ops"), "read-only:  /usr", "/var/log",
			filepath.Join(stateDir, "agents", "boxed"), "confined:", "holds: ", "providers: cloud (openai) m"}, []string{sandboxSecret}},
		// This scheduler has no berth-egress (its default egress_binary and
		// egress_user do not exist): a remote provider cannot be reached.
		{"A_run_that_would_fail_is_shown_and_exits_1", []string{"offline"}, ExitFailed, []string{"PROBLEM", "provider needs network", "the egress proxy cannot serve it"}, nil},
		{"JSON_is_the_plan_without_keys", []string{"--json", "ops"}, ExitOK, []string{`"backend": "landlock"`, `"memory_bytes": 536870912`, `"why"`}, []string{sandboxSecret}},
		{"An_unknown_agent_fails", []string{"nope"}, ExitFailed, []string{`unknown agent "nope"`}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code := berthctl(conn, append([]string{"sandbox", "explain"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(out, n) {
					t.Errorf("output holds %q:\n%s", n, out)
				}
			}
		})
	}
}

func TestSandboxExplainJSONDecodesToThePlan(t *testing.T) {
	t.Parallel()
	conn, _ := schedulerOnBus(t, sandboxConfig, nil)
	out, code := berthctl(conn, "sandbox", "explain", "--json", "boxed")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	e, err := busapi.ExplanationFromWire(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if e.Plan.Backend != busapi.BackendContainer || e.Plan.Limits.MemoryBytes != 256<<20 || e.Plan.Container.Runtime != "runc" || !e.BackendAvailable {
		t.Errorf("plan %+v", e.Plan)
	}
}

func TestSandboxExplainNamesARunUserThatDoesNotExist(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t) // only a root scheduler switches to (and so looks up) the run user
	// agent_uids off: every agent runs as run_as.
	conn, _ := schedulerOnBus(t, "[scheduler]\nrun_as = \"berth-test-no-such-user\"\nagent_uids = \"off\"\n\n[[agents]]\nid = \"ops\"\n", nil)
	out, code := berthctl(conn, "sandbox", "explain", "ops")
	if code != ExitFailed || !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "berth-test-no-such-user") {
		t.Fatalf("exit %d, want 1 with the missing run user named:\n%s", code, out)
	}
}

func TestSandboxExplainShowsAnAgentWithoutANetworkReachingItsProviderThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t) // the scheduler looks the egress user up only as root
	proxy, err := testenv.Build(t.TempDir(), "berth-egress", "github.com/berth-dev/berth/cmd/berth-egress")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(sandboxConfig, "[scheduler]\n", fmt.Sprintf("[scheduler]\negress_binary = %q\negress_user = \"daemon\"\n", proxy), 1)
	conn, _ := schedulerOnBus(t, cfg, map[string]string{"CLOUD_KEY": sandboxSecret})
	out, code := berthctl(conn, "sandbox", "explain", "offline")
	if code != ExitOK {
		t.Fatalf("exit %d, want %d (the proxy serves the provider)\n%s", code, ExitOK, out)
	}
	for _, want := range []string{"the only way out is the run's egress socket", "egress only through the run's socket", "proxy on 127.0.0.1:3128); no provider key in the sandbox", "providers: cloud (openai) m"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, never := range []string{"PROBLEM", "provider needs network", sandboxSecret} {
		if strings.Contains(out, never) {
			t.Errorf("output holds %q:\n%s", never, out)
		}
	}
}
