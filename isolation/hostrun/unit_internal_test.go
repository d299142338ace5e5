package hostrun

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// The transient unit's properties decide what a run under systemd may do;
// the agent's request (with the provider key) must never be one of them.
func TestTransientUnitProperties(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		policy            agentproto.Policy
		cutNetwork        bool
		wantPrivateNet    bool
		wantProtectStrict bool
	}{
		{"Confined_run_without_network_is_cut_off", agentproto.Policy{}, true, true, true},
		{"Confined_run_with_network_keeps_it", agentproto.Policy{Network: true}, false, false, true},
		{"Unrestricted_run_without_network_is_cut_off_too", agentproto.Policy{Unrestricted: true}, true, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := isolation.Spec{RunID: "r1", AgentID: "a", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent"}
			req := agentproto.Request{RunID: "r1", Policy: tc.policy, Provider: agentproto.Provider{Key: "sk-SECRET-KEY"}}
			u := newUnitRun(spec, req, []byte(`{"provider":{"key":"sk-SECRET-KEY"}}`), nil, tc.cutNetwork)
			props := Runner{}.unitProperties(u, UnitName("r1"), 10, 11, 12)
			got := map[string]string{}
			for _, p := range props {
				got[p.Name] = p.Value.String()
				if strings.Contains(p.Value.String(), "SECRET") {
					t.Fatalf("property %s carries the provider key: %s", p.Name, p.Value)
				}
			}
			if _, ok := got["PrivateNetwork"]; ok != tc.wantPrivateNet {
				t.Errorf("PrivateNetwork set = %v, want %v", ok, tc.wantPrivateNet)
			}
			if _, ok := got["ProtectSystem"]; ok != tc.wantProtectStrict {
				t.Errorf("ProtectSystem set = %v, want %v", ok, tc.wantProtectStrict)
			}
			for _, name := range []string{"MemoryMax", "TasksMax"} {
				if _, ok := got[name]; !ok {
					t.Errorf("%s missing: every run gets resource limits", name)
				}
			}
		})
	}
}

func TestHostRunsHonourTheAgentsMemoryLimit(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{RunID: "r1", Workspace: "/ws", AgentBinary: "/bin/true"}
	spec.Container.MemoryLimit = "1g"
	u := newUnitRun(spec, agentproto.Request{RunID: "r1"}, nil, nil, true)
	props := Runner{}.forAgent(spec).unitProperties(u, UnitName("r1"), 10, 11, 12)
	for _, p := range props {
		if p.Name == "MemoryMax" {
			if got := p.Value.Value(); got != uint64(1<<30) {
				t.Fatalf("MemoryMax = %v, want 1 GiB from memory_limit", got)
			}
			return
		}
	}
	t.Fatal("no MemoryMax property")
}
