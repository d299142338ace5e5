package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestSandboxKeysResolveWithDefaults(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": "[scheduler]\nagent_uids = \"200000-200099\"\nallow_rlimit_fallback = true\n[agent_defaults]\nworkspace_quota = \"64m\"\n[[agents]]\nid = \"a\"\n[[agents]]\nid = \"b\"\nworkspace_quota = \"0\"\n"})
	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := c.Scheduler.AgentUIDs; got != (config.UIDRange{First: 200000, Last: 200099}) || !c.Scheduler.AllowRlimitFallback {
		t.Errorf("Scheduler = %+v, want agent_uids 200000-200099 and the rlimit fallback", c.Scheduler)
	}
	a, _ := c.Agent("a")
	b, _ := c.Agent("b")
	if a.WorkspaceQuota != 64<<20 || b.WorkspaceQuota != 0 {
		t.Errorf("quotas a=%d b=%d, want 64 MiB (agent_defaults) and 0 (the agent's own)", a.WorkspaceQuota, b.WorkspaceQuota)
	}
	off := writeConfig(t, map[string]string{"berth.toml": "[scheduler]\nagent_uids = \"off\"\n[[agents]]\nid = \"a\"\n"})
	if c, err := config.Load(off); err != nil || !c.Scheduler.AgentUIDs.Off {
		t.Errorf("agent_uids = \"off\": %+v, %v; want Off", c.Scheduler.AgentUIDs, err)
	}
}

func TestSandboxKeysRefuseBadValuesNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, toml, want string }{
		{"A range written backwards", "[scheduler]\nagent_uids = \"300-200\"\n", `berth.toml:2: scheduler.agent_uids: invalid uid range "300-200"`},
		{"A range over system accounts", "[scheduler]\nagent_uids = \"10-5000\"\n", "below 1000"},
		{"A range over nobody", "[scheduler]\nagent_uids = \"60000-70000\"\n", "65534 (nobody)"},
		{"A range that is not one", "[scheduler]\nagent_uids = \"lots\"\n", "want FIRST-LAST"},
		{"A quota that is not a size", "[[agents]]\nid = \"a\"\nworkspace_quota = \"big\"\n", `berth.toml:3: agents[0].workspace_quota: invalid workspace quota "big"`},
		{"A quota too small to hold a filesystem", "[[agents]]\nid = \"a\"\nworkspace_quota = \"1m\"\n", "below the minimum of 16m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": tc.toml}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
