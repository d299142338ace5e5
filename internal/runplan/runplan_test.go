package runplan_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

const secret = "sk-runplan-SECRET-0815"

// opsWithoutNetwork is a drop-in that takes agent ops's direct network.
const opsWithoutNetwork = "[[agents]]\nid = \"ops\"\nfile_access.allow_network = false\n"

// testConfig has a landlock agent "ops", a container agent "boxed", an
// unrestricted agent "free" and one with a workspace of its own, "docs". It
// is loaded as the scheduler loads berth.toml: a plan is only ever compiled
// from a checked, resolved config.
// dropIns are berth.d files read after it, as an admin's would be.
func testConfig(t testing.TB, dropIns ...string) *config.Config {
	t.Helper()
	cfg := loadConfig(t, `
[providers]
primary = "cloud"

[providers.cloud]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CLOUD_KEY"

[[agents]]
id = "ops"
container_mode.memory_limit = "1g"
file_access = { allow_network = true, allow_read = ["/srv"] }

[[agents]]
id = "boxed"
provider = "local"
container_mode = { enabled = true, network = "none", memory_limit = "256m", binds = ["/srv/data:/data:ro"], warm = 2 }

[[agents]]
id = "free"
provider = "local"
file_access.unrestricted = true

[[agents]]
id = "docs"
workspace = "/srv/docs-ws"
provider = "local"

[scheduler]
run_as = "nobody"
default_timeout_seconds = 60
`, dropIns...)
	// As if read from /etc/berth: the plans protect the config's directory.
	cfg.Sources = []string{"/etc/berth/berth.toml"}
	return cfg
}

// loadConfig loads text as berth.toml and dropIns as berth.d/NN.toml.
func loadConfig(t testing.TB, text string, dropIns ...string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "berth.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, d := range dropIns {
		if err := os.WriteFile(filepath.Join(dir, "berth.d", fmt.Sprintf("%02d.toml", i)), []byte(d), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("cannot load the test config: %v", err)
	}
	return cfg
}

func facts(t *testing.T, env map[string]string) runplan.HostFacts {
	// Short, like a real state dir: the egress socket's path must fit a Unix
	// socket address (t.TempDir's names do not).
	dir, err := os.MkdirTemp("", "rp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "scheduler")
	return runplan.HostFacts{
		StateDir: state,
		RunUser:  &isolation.RunUser{Name: "nobody", UID: 65534, GID: 65534},
		Getenv:   func(k string) string { return env[k] },
	}
}

func TestCompileDecidesEachRunsSandbox(t *testing.T) {
	t.Parallel()
	env := map[string]string{"CLOUD_KEY": secret}
	tests := []struct {
		name  string
		agent string
		force bool
		check func(t *testing.T, p isolation.Plan, host runplan.HostFacts)
	}{
		{"A_landlock_agent_gets_a_host_policy_and_the_memory_limit_of_its_config", "ops", false, func(t *testing.T, p isolation.Plan, host runplan.HostFacts) {
			ws := filepath.Join(host.StateDir, "agents", "ops")
			if p.Backend != isolation.BackendLandlock || p.Workspace != ws || p.SandboxWorkspace != ws {
				t.Errorf("backend %q workspace %q in sandbox %q", p.Backend, p.Workspace, p.SandboxWorkspace)
			}
			if p.Limits.MemoryBytes != 1<<30 {
				t.Errorf("memory = %d, want 1g from memory_limit", p.Limits.MemoryBytes)
			}
			if !p.Network.Allowed || !p.Policy.Network || p.Network.Mode != "host" {
				t.Errorf("network %+v policy network %v, want allowed", p.Network, p.Policy.Network)
			}
			if !slices.Contains(p.Policy.AllowReadWrite, ws) || !slices.Contains(p.Policy.AllowRead, "/srv") {
				t.Errorf("policy %+v lacks the workspace or /srv", p.Policy)
			}
			for _, want := range []string{host.StateDir, "/etc/berth", "/srv/docs-ws", filepath.Join(host.StateDir, "agents", "boxed")} {
				if !slices.Contains(p.Protected, want) {
					t.Errorf("protected %q lacks %s", p.Protected, want)
				}
			}
			if !slices.Contains(p.Policy.Deny, "/srv/docs-ws") {
				t.Errorf("deny %q lacks the other agent's workspace", p.Policy.Deny)
			}
			if len(p.Providers) == 0 || p.Providers[0].Key != secret {
				t.Errorf("providers %+v: the run's request needs the key", p.Providers)
			}
		}},
		{"A_container_agent_gets_the_container_policy_mounts_and_limits", "boxed", false, func(t *testing.T, p isolation.Plan, host runplan.HostFacts) {
			if p.Backend != isolation.BackendContainer || p.SandboxWorkspace != isolation.ContainerWorkspace {
				t.Errorf("backend %q sandbox workspace %q", p.Backend, p.SandboxWorkspace)
			}
			if p.Policy.Network || p.Network.Allowed || p.Network.Mode != "none" {
				t.Errorf("network %+v policy %v, want none", p.Network, p.Policy.Network)
			}
			if !slices.Contains(p.Policy.AllowReadWrite, isolation.ContainerWorkspace) || slices.Contains(p.Policy.AllowReadWrite, p.Workspace) {
				t.Errorf("policy read-write %q: want container paths, not host ones", p.Policy.AllowReadWrite)
			}
			want := []isolation.Mount{{Source: p.Workspace, Target: "/workspace"}, {Source: "/srv/data", Target: "/data", ReadOnly: true}}
			if !slices.Equal(p.Mounts, want) {
				t.Errorf("mounts %+v, want %+v", p.Mounts, want)
			}
			if p.Limits.MemoryBytes != 256<<20 || p.Limits.TmpfsBytes != 256<<20 || p.Limits.Pids != 256 || p.Container.Warm != 2 {
				t.Errorf("limits %+v warm %d", p.Limits, p.Container.Warm)
			}
		}},
		{"An_unrestricted_agent_gets_no_file_confinement", "free", false, func(t *testing.T, p isolation.Plan, _ runplan.HostFacts) {
			if p.Backend != isolation.BackendUnrestricted || !p.Policy.Unrestricted {
				t.Errorf("backend %q policy %+v", p.Backend, p.Policy)
			}
		}},
		{"A_scheduler_run_with_unrestricted_compiles_landlock_agents_unconfined", "docs", true, func(t *testing.T, p isolation.Plan, _ runplan.HostFacts) {
			if p.Backend != isolation.BackendUnrestricted || !p.Policy.Unrestricted {
				t.Errorf("backend %q policy %+v", p.Backend, p.Policy)
			}
		}},
		{"A_configured_workspace_is_used_as_it_is", "docs", false, func(t *testing.T, p isolation.Plan, _ runplan.HostFacts) {
			if p.Workspace != "/srv/docs-ws" || p.Timeout != time.Minute || p.User == nil || p.User.UID != 65534 {
				t.Errorf("workspace %q timeout %s user %+v", p.Workspace, p.Timeout, p.User)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := facts(t, env)
			host.ForceUnrestricted = tc.force
			p, err := runplan.Compile(testConfig(t), tc.agent, "r1", host)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			if p.RunID != "r1" || p.AgentID != tc.agent {
				t.Errorf("run %q agent %q", p.RunID, p.AgentID)
			}
			tc.check(t, p, host)
		})
	}
}

func TestCompileRefusesARunThatCouldNotWork(t *testing.T) {
	t.Parallel()
	noNet := testConfig(t, opsWithoutNetwork)
	tests := []struct {
		name   string
		cfg    *config.Config
		agent  string
		env    map[string]string
		reason string
		detail string
	}{
		{"An_unknown_agent", testConfig(t), "nope", nil, isolation.ReasonAgentNotConfigured, "unknown agent"},
		{"A_key_missing_from_the_schedulers_environment", testConfig(t), "ops", nil, isolation.ReasonStart, "CLOUD_KEY is not set"},
		{"A_network_provider_without_network_when_no_egress_proxy_can_serve_it", noNet, "ops", map[string]string{"CLOUD_KEY": secret}, isolation.ReasonProviderNeedsNetwork, "allow_network = true"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := facts(t, tc.env)
			host.EgressUnavailable = errors.New("no user berth-egress")
			_, err := runplan.Compile(tc.cfg, tc.agent, "r1", host)
			if err == nil || isolation.ReasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("Compile = %v, want reason %q with %q", err, tc.reason, tc.detail)
			}
		})
	}
}

func TestExplainShowsThePlanAndWhyWithoutAnyKey(t *testing.T) {
	t.Parallel()
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	e, err := runplan.Explain(testConfig(t), "ops", host)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(e)
	if strings.Contains(string(data), secret) {
		t.Fatalf("the explanation holds the key: %s", data)
	}
	compiled, _ := runplan.Compile(testConfig(t), "ops", "", host)
	if e.Plan.Limits != compiled.Limits || !slices.Equal(e.Plan.Policy.Deny, compiled.Policy.Deny) || e.Plan.Providers[0].Model != compiled.Providers[0].Model {
		t.Errorf("explained plan %+v differs from the compiled one %+v", e.Plan, compiled)
	}
	for _, key := range []string{"backend", "network", "limits", "policy", "providers", "timeout", "user"} {
		if e.Why[key] == "" {
			t.Errorf("no why for %s: %v", key, e.Why)
		}
	}
	if len(e.Problems) != 0 {
		t.Errorf("problems %q, want none", e.Problems)
	}

	missing, err := runplan.Explain(testConfig(t), "ops", facts(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(missing.Problems) != 1 || !strings.Contains(missing.Problems[0], "CLOUD_KEY") || len(missing.Plan.Providers) == 0 {
		t.Errorf("a missing key: problems %q providers %+v; want the problem named and the chain shown", missing.Problems, missing.Plan.Providers)
	}
}
