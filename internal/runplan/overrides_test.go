package runplan_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/runplan"
)

func TestAScheduledJobsOverridesChangeItsRunsModelEgressModelAndTimeout(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork)
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	ov := runplan.Overrides{Model: "small", Timeout: 7 * time.Second, From: "schedule standup"}
	p, err := runplan.CompileWith(cfg, "ops", "r1", 1, ov, host)
	if err != nil {
		t.Fatalf("CompileWith: %v", err)
	}
	if p.Timeout != 7*time.Second {
		t.Errorf("timeout %s, want max_runtime's 7s", p.Timeout)
	}
	if len(p.Providers) == 0 {
		t.Fatalf("%d providers, want the agent's provider with model small", len(p.Providers))
	}
	if p.Providers[0].Model != "small" {
		t.Fatalf("provider model %q, want small", p.Providers[0].Model)
	}
	// The proxy's strict model check allows what the plan's endpoints say.
	if p.Egress == nil || len(p.Egress.Providers) != 1 || p.Egress.Providers[0].Model != "small" {
		t.Fatalf("egress providers %+v, want cloud with model small only", p.Egress)
	}

	plain, err := runplan.CompileWith(cfg, "ops", "r2", 1, runplan.Overrides{}, host)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Providers[0].Model != "m" || plain.Egress.Providers[0].Model != "m" || plain.Timeout == 7*time.Second {
		t.Errorf("a run without overrides got model %q (egress %q), timeout %s; want the agent's", plain.Providers[0].Model, plain.Egress.Providers[0].Model, plain.Timeout)
	}
}

func TestAnOverridesReasonNamesItsSchedule(t *testing.T) {
	t.Parallel()
	host := facts(t, map[string]string{"CLOUD_KEY": secret})
	e, err := runplan.ExplainWith(testConfig(t, opsWithoutNetwork), "ops", runplan.Overrides{Model: "small", Timeout: time.Minute, From: "schedule standup"}, host)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.Why["timeout"], "max_runtime of schedule standup") || !strings.Contains(e.Why["providers"], `model "small" of schedule standup`) {
		t.Errorf("why timeout %q providers %q; want the schedule named", e.Why["timeout"], e.Why["providers"])
	}
}
