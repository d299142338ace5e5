package config

import (
	"fmt"
	"math"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Prices, budgets and read-only egress (docs/adr/0024-usage-and-budgets.md):
//
//	[providers.openai.prices."gpt-4o-mini"]
//	input = 0.15      # per million input tokens
//	output = 0.60     # per million output tokens
//	cached = 0.075    # per million cached input tokens (default: input)
//
//	[agents.budget]
//	tokens_per_day = 2000000
//	cost_per_day = 5.0
//	cost_per_run = 0.5
//	requests_per_minute = 30
//
//	[agents.egress]
//	mode = "read-only"

// ProviderPrices is [providers.NAME.prices]: every key is a model's table.
type ProviderPrices struct {
	Models []*entry[ModelPrice] `berth:"rest=model"`
}

// ModelPrice is one model's [providers.NAME.prices.MODEL].
type ModelPrice struct {
	Model  string   `berth:"name"`
	Input  *float64 `toml:"input" berth:"check=price"`
	Output *float64 `toml:"output" berth:"check=price"`
	Cached *float64 `toml:"cached" berth:"check=price"`
}

// ModelPrices are the provider's prices by model, as the egress proxy
// costs its calls.
func (p Provider) ModelPrices() map[string]egresspolicy.Price {
	if len(p.Prices.Models) == 0 {
		return nil
	}
	out := make(map[string]egresspolicy.Price, len(p.Prices.Models))
	for _, e := range p.Prices.Models {
		m := e.v
		out[m.Model] = egresspolicy.Price{Input: firstSet(0, m.Input), Output: firstSet(0, m.Output), Cached: firstSet(0, m.Cached)}
	}
	return out
}

// BudgetSettings is [agents.budget] (or [agent_defaults.budget]); each key
// not set in the agent comes from the defaults, and unset everywhere is
// no limit.
type BudgetSettings struct {
	TokensPerDay      *int     `toml:"tokens_per_day" berth:"check=budgetCount"`
	CostPerDay        *float64 `toml:"cost_per_day" berth:"check=price"`
	CostPerRun        *float64 `toml:"cost_per_run" berth:"check=price"`
	RequestsPerMinute *int     `toml:"requests_per_minute" berth:"check=budgetCount"`
}

func budgetOf(s, d *BudgetSettings) egresspolicy.Budget {
	return egresspolicy.Budget{
		TokensPerDay:      int64(firstSet(0, s.TokensPerDay, d.TokensPerDay)),
		CostPerDay:        firstSet(0, s.CostPerDay, d.CostPerDay),
		CostPerRun:        firstSet(0, s.CostPerRun, d.CostPerRun),
		RequestsPerMinute: firstSet(0, s.RequestsPerMinute, d.RequestsPerMinute),
	}
}

// The value checks of these keys, beside the others in valueChecks.
func init() {
	valueChecks["price"] = func(v float64) string {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprintf("must be a number of 0 or more, not %v", v)
		}
		return ""
	}
	valueChecks["budgetCount"] = func(n int) string {
		if n < 0 {
			return fmt.Sprintf("must be 0 (no limit) or more, not %d", n)
		}
		return ""
	}
	valueChecks["egressMode"] = oneOf(egresspolicy.ModeReadOnly)
}

// budgetSettingsOf is b as config check writes it: the limits set.
func budgetSettingsOf(b egresspolicy.Budget) BudgetSettings {
	var s BudgetSettings
	if b.TokensPerDay > 0 {
		n := int(b.TokensPerDay)
		s.TokensPerDay = &n
	}
	if b.CostPerDay > 0 {
		s.CostPerDay = &b.CostPerDay
	}
	if b.CostPerRun > 0 {
		s.CostPerRun = &b.CostPerRun
	}
	if b.RequestsPerMinute > 0 {
		s.RequestsPerMinute = &b.RequestsPerMinute
	}
	return s
}

// egressSettingsOf is a's [agents.egress] as written back; approval_timeout
// only with ask rules, which alone use it.
func egressSettingsOf(a Agent) EgressSettings {
	e := EgressSettings{Allow: a.EgressAllow, Ask: a.EgressAsk, Git: a.EgressGit, Mode: egressModeOf(a)}
	if len(a.EgressAsk) > 0 {
		d := Duration(a.EgressApprovalTimeout)
		e.ApprovalTimeout = &d
	}
	return e
}

func egressModeOf(a Agent) string {
	if a.EgressReadOnly {
		return egresspolicy.ModeReadOnly
	}
	return ""
}

// PricesOf is prices as [providers.NAME.prices] would give them, for a
// Config made in code (a test's).
func PricesOf(prices map[string]egresspolicy.Price) ProviderPrices {
	var out ProviderPrices
	for model, p := range prices {
		in, o, c := p.Input, p.Output, p.Cached
		out.Models = append(out.Models, &entry[ModelPrice]{v: ModelPrice{Model: model, Input: &in, Output: &o, Cached: &c}})
	}
	return out
}
