package scheduler

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

const explainSecret = "sk-explain-SECRET-4242"

func writeConfig(t *testing.T, path, memory, network string) *config.Config {
	t.Helper()
	text := `[scheduler]
run_as = "nobody"

[providers]
primary = "cloud"
[providers.cloud]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CLOUD_KEY"

[[agents]]
id = "ops"
[agents.container_mode]
memory_limit = "` + memory + `"
[agents.file_access]
allow_network = ` + network + `

[[agents]]
id = "other"
`
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// ExplainAgent answers with the scheduler's own plan: after the config on
// disk changes and the scheduler reloads, it shows the new limits and
// network, never a key.
func TestExplainAgentFollowsAReloadedConfig(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	path := filepath.Join(t.TempDir(), "berth.toml")
	cfg := writeConfig(t, path, "256m", "true")
	stateDir := t.TempDir()
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(k string) string { return map[string]string{"CLOUD_KEY": explainSecret}[k] },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	obj := b.Conn(t).Object(bus.SchedulerName, bus.SchedulerPath)
	explain := func() busapi.Explanation {
		t.Helper()
		var out string
		if err := obj.Call(bus.SchedulerInterface+".ExplainAgent", 0, "ops").Store(&out); err != nil {
			t.Fatalf("ExplainAgent: %v", err)
		}
		if strings.Contains(out, explainSecret) {
			t.Fatalf("ExplainAgent sent the provider key: %s", out)
		}
		e, err := busapi.ExplanationFromWire(out)
		if err != nil {
			t.Fatalf("ExplainAgent sent %q: %v", out, err)
		}
		return e
	}

	e := explain()
	if e.Plan.Limits.MemoryBytes != 256<<20 || !e.Plan.Network.Allowed || !e.BackendAvailable || e.Confinement == nil || len(e.Problems) != 0 {
		t.Fatalf("first plan: memory %d network %+v available %v confinement %v problems %q", e.Plan.Limits.MemoryBytes, e.Plan.Network, e.BackendAvailable, e.Confinement, e.Problems)
	}
	if !strings.Contains(strings.Join(e.Plan.Policy.Deny, " "), filepath.Join(stateDir, "agents", "other")) {
		t.Errorf("deny %q lacks the other agent's workspace", e.Plan.Policy.Deny)
	}

	s.Reload(writeConfig(t, path, "1g", "false"))
	e = explain()
	if e.Plan.Limits.MemoryBytes != 1<<30 || e.Plan.Network.Allowed || e.Plan.Policy.Network {
		t.Fatalf("after reload: memory %d network %+v, want 1g and none", e.Plan.Limits.MemoryBytes, e.Plan.Network)
	}
	if len(e.Problems) != 1 || !strings.Contains(e.Problems[0], isolation.ReasonProviderNeedsNetwork) {
		t.Errorf("after reload: problems %q, want the provider that needs the network named", e.Problems)
	}

	var out string
	err = obj.Call(bus.SchedulerInterface+".ExplainAgent", 0, "nope").Store(&out)
	if bus.ErrorName(err) != bus.ErrNotFound {
		t.Errorf("an unknown agent gave %v, want %s", err, bus.ErrNotFound)
	}
}
