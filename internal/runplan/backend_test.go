package runplan_test

import (
	"errors"
	"testing"

	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// The scheduler takes a run's backend from its compiled plan only, and
// records it on a run that was refused: a refused plan still names it.
func TestARefusedPlanStillNamesItsBackend(t *testing.T) {
	t.Parallel()
	badBind := testConfig()
	badBind.Agents[1].ContainerMode.Binds = []string{"/var/run/docker.sock:/sock"}
	tests := []struct {
		name, agent string
		cfgBad      bool
		force       bool
		want        isolation.BackendKind
	}{
		{"A_landlock_agent_without_its_run_user", "docs", false, false, isolation.BackendLandlock},
		{"A_landlock_agent_forced_unrestricted_without_its_run_user", "docs", false, true, isolation.BackendUnrestricted},
		{"A_container_agent_with_a_forbidden_bind", "boxed", true, false, isolation.BackendContainer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := facts(t, nil)
			host.ForceUnrestricted = tc.force
			cfg := testConfig()
			if tc.cfgBad {
				cfg = badBind
			} else {
				host.RunUserErr = errors.New("no such user")
			}
			p, err := runplan.Compile(cfg, tc.agent, "r1", host)
			if err == nil {
				t.Fatal("Compile accepted the run")
			}
			if p.Backend != tc.want {
				t.Errorf("refused plan names backend %q, want %q", p.Backend, tc.want)
			}
		})
	}
}
