package runplan_test

import (
	"errors"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// The scheduler takes a run's backend from its compiled plan only, and
// records it on a run that was refused: a refused plan still names it.
func TestARefusedPlanStillNamesItsBackend(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, agent string
		force       bool
		want        isolation.BackendKind
	}{
		{"A_landlock_agent_without_its_run_user", "docs", false, isolation.BackendLandlock},
		{"A_landlock_agent_forced_unrestricted_without_its_run_user", "docs", true, isolation.BackendUnrestricted},
		{"A_container_agent_without_its_run_user", "boxed", false, isolation.BackendContainer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := facts(t, nil)
			host.ForceUnrestricted = tc.force
			host.RunUserErr = errors.New("no such user")
			p, err := runplan.Compile(testConfig(t), tc.agent, "r1", host)
			if err == nil {
				t.Fatal("Compile accepted the run")
			}
			if p.Backend != tc.want {
				t.Errorf("refused plan names backend %q, want %q", p.Backend, tc.want)
			}
		})
	}
}

// Container settings are checked once, when berth.toml is loaded, and the
// container backend checks the plan again at the engine; Compile does not
// check a third time, and a malformed bind in a Config made in code is
// passed on for the backend to refuse rather than panicking the scheduler.
func TestCompilePassesAMalformedBindOnToTheBackend(t *testing.T) {
	t.Parallel()
	cfg := config.Defaults()
	enabled := true
	cfg.Agents = []config.AgentSettings{{ID: "boxed", ContainerMode: config.ContainerSettings{Enabled: &enabled, Binds: []string{"no-colon"}}}}
	p, err := runplan.Compile(cfg, "boxed", "r1", facts(t, nil))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	if len(p.Mounts) != 2 || p.Mounts[1] != (isolation.Mount{Source: "no-colon"}) {
		t.Errorf("mounts %+v, want the workspace and the bind as written", p.Mounts)
	}
}
