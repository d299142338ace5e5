package runplan

import (
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// Overrides are what one run changes of its agent's plan: a scheduled job's
// model and max_runtime ([[schedules]]). The zero value changes nothing.
type Overrides struct {
	// Model replaces the model of the agent's own provider (the first of
	// its chain, as the agent's model key does); the fallbacks keep theirs.
	Model string
	// Timeout replaces the agent's timeout: an admin who writes a job's
	// max_runtime means that length, shorter or longer than a chat reply's.
	Timeout time.Duration
	// From names where the overrides come from, for the plan's reasons
	// ("schedule standup").
	From string
}

// CompileWith is CompileAttempt for a run with overrides. The egress
// proxy's model check reads the plan's providers, so it allows exactly
// the overriding model for this run, and no other.
func CompileWith(cfg *config.Config, agentID, runID string, attempt int, ov Overrides, host HostFacts) (isolation.Plan, error) {
	c, err := compileWith(cfg, agentID, runID, attempt, ov, host)
	if err != nil {
		return isolation.Plan{Backend: c.plan.Backend}, err
	}
	if len(c.problems) > 0 {
		return isolation.Plan{Backend: c.plan.Backend}, c.problems[0]
	}
	return c.plan, nil
}

// ExplainWith is Explain for a run with overrides.
func ExplainWith(cfg *config.Config, agentID string, ov Overrides, host HostFacts) (Explanation, error) {
	c, err := compileWith(cfg, agentID, "", 0, ov, host)
	if err != nil {
		return Explanation{}, err
	}
	e := Explanation{Plan: c.plan.Redacted(), Why: c.why}
	for _, p := range c.problems {
		e.Problems = append(e.Problems, p.Error())
	}
	return e, nil
}

// apply changes agent a as ov says, before anything is compiled from it,
// so every decision (provider chain, egress endpoints, timeout) sees it.
func (ov Overrides) apply(a *config.Agent) {
	if ov.Model != "" {
		a.Model = ov.Model
	}
	if ov.Timeout > 0 {
		a.Timeout = ov.Timeout
	}
}

// explain adds to c's reasons what ov changed.
func (ov Overrides) explain(c *compiled) {
	if ov.Timeout > 0 {
		c.why["timeout"] = fmt.Sprintf("%s: max_runtime of %s, in place of the agent's timeout; then the sandbox is killed (reason %q)", ov.Timeout, ov.From, isolation.ReasonTimeout)
	}
	if ov.Model != "" && c.why["providers"] != "" {
		c.why["providers"] += fmt.Sprintf("; model %q of %s in place of the agent's, for its own provider (the egress proxy allows that model only)", ov.Model, ov.From)
	}
}
