package config_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

// What no file sets is defaulted once, where the Config is resolved:
// Defaults is the Config of a berth.toml that sets nothing, and an agent's
// timeout comes from the resolved [scheduler], never from a default of
// Agent's own.
func TestDefaultsAreTheConfigOfAnEmptyFile(t *testing.T) {
	t.Parallel()
	loaded, err := config.Load(writeConfig(t, map[string]string{"berth.toml": ""}))
	if err != nil {
		t.Fatal(err)
	}
	loaded.Sources = nil
	defaults := config.Defaults()
	if !reflect.DeepEqual(loaded, defaults) {
		t.Errorf("Defaults() =\n%+v\nan empty berth.toml loads as\n%+v", defaults, loaded)
	}

	defaults.Agents = []config.AgentSettings{{ID: "a"}}
	if a, err := defaults.Agent("a"); err != nil || a.Timeout != 300*time.Second {
		t.Errorf("an agent of Defaults() has timeout %s, %v; want [scheduler]'s 5m0s", a.Timeout, err)
	}
	bare := &config.Config{Agents: []config.AgentSettings{{ID: "a"}}}
	if a, err := bare.Agent("a"); err != nil || a.Timeout != 0 {
		t.Errorf("an agent of a Config made without its defaults has timeout %s, %v; want 0: Agent defaults nothing [scheduler] holds", a.Timeout, err)
	}
}
