package config_test

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

// builtInSandbox is [agents.sandbox] when nothing sets it.
var builtInSandbox = config.Sandbox{Scope: "message", IdleStop: 15 * time.Minute, MaxLifetime: 24 * time.Hour, MaxPerAgent: 3}

func TestSandboxSettingsResolveAgentThenDefaultsThenBuiltIns(t *testing.T) {
	t.Parallel()
	c := load(t, `
[agent_defaults.sandbox]
idle_stop = "4s"

[[agents]]
id = "bare"

[[agents]]
id = "kept"
[agents.sandbox]
scope = "conversation"
max_lifetime = "2h"
max_per_agent = 1
`)
	for id, want := range map[string]config.Sandbox{
		"bare": {Scope: "message", IdleStop: 4 * time.Second, MaxLifetime: 24 * time.Hour, MaxPerAgent: 3},
		"kept": {Scope: "conversation", IdleStop: 4 * time.Second, MaxLifetime: 2 * time.Hour, MaxPerAgent: 1},
	} {
		a, err := c.Agent(id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.Sandbox, want) {
			t.Errorf("agent %s: Sandbox = %+v, want %+v", id, a.Sandbox, want)
		}
	}
	none := load(t, "[[agents]]\nid = \"a\"\n")
	a, _ := none.Agent("a")
	if want := (config.Sandbox{Scope: "message", IdleStop: 15 * time.Minute, MaxLifetime: 24 * time.Hour, MaxPerAgent: 3}); a.Sandbox != want {
		t.Errorf("built-in Sandbox = %+v, want %+v", a.Sandbox, want)
	}
}

func TestBadSandboxSettingsAreNamedByFileLineAndKey(t *testing.T) {
	t.Parallel()
	const base = "[[agents]]\nid = \"coder\"\n[agents.sandbox]\n"
	for name, tc := range map[string]struct{ text, want string }{
		"An unknown scope":         {`scope = "thread"`, `berth.toml:4: agents[0].sandbox.scope: "thread" is not one of message, conversation`},
		"An idle stop under 1s":    {`idle_stop = "500ms"`, `berth.toml:4: agents[0].sandbox.idle_stop: must be a length of time from 1s to 8760h0m0s, not 500ms`},
		"A lifetime with no unit":  {`max_lifetime = "24"`, `berth.toml:4: agents[0].sandbox.max_lifetime:`},
		"No sandbox per agent":     {`max_per_agent = 0`, `berth.toml:4: agents[0].sandbox.max_per_agent: must be at least 1, not 0`},
		"A number for a duration":  {`idle_stop = 15`, `berth.toml:4: agents[0].sandbox.idle_stop:`},
		"An unknown key is caught": {`idle = "4s"`, `berth.toml:4: agents[0].sandbox.idle: unknown key`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": base + tc.text + "\n"})
			_, err := config.Load(path)
			if err == nil {
				t.Fatal("Load accepted it")
			}
			lines := errorLines(t, err, path)
			if len(lines) != 1 || !strings.HasPrefix(lines[0], tc.want) {
				t.Errorf("errors = %q, want one starting %q", lines, tc.want)
			}
		})
	}
}

func TestConfigCheckNotesThatScopeMessageIgnoresTheSandboxLimits(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": `
[[agents]]
id = "plain"
[agents.sandbox]
idle_stop = "4s"

[[agents]]
id = "kept"
[agents.sandbox]
scope = "conversation"
idle_stop = "4s"
`})
	var plain, kept bytes.Buffer
	if err := config.WriteCheck(&plain, path, "plain"); err != nil {
		t.Fatal(err)
	}
	if err := config.WriteCheck(&kept, path, "kept"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plain.String(), `# scope = "message" ignores idle_stop, max_lifetime and max_per_agent`) {
		t.Errorf("check of a message-scoped agent with idle_stop has no note:\n%s", plain.String())
	}
	for _, want := range []string{`scope = "conversation"`, `idle_stop = "4s"`, `max_lifetime = "24h0m0s"`, `max_per_agent = 3`} {
		if !strings.Contains(kept.String(), want) {
			t.Errorf("check of a conversation-scoped agent lacks %s:\n%s", want, kept.String())
		}
	}
	if strings.Contains(kept.String(), "ignores") {
		t.Errorf("check of a conversation-scoped agent says something is ignored:\n%s", kept.String())
	}
}
