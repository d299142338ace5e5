package egresspolicy

import (
	"cmp"
	"slices"
	"time"
)

// Price is what one model costs, in the admin's currency per million
// tokens ([providers.X.prices], docs/adr/0024-usage-and-budgets.md).
// Cached is the price of input tokens read from the provider's cache; 0
// prices them as Input.
type Price struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
	Cached float64 `json:"cached,omitempty"`
}

// Tokens are what provider calls used. Input counts every prompt token,
// cached ones included (OpenAI's prompt_tokens; Anthropic's input_tokens
// plus cache_read_input_tokens plus cache_creation_input_tokens); Cached
// is the part read from the provider's cache.
type Tokens struct {
	Input  int64 `json:"input"`
	Output int64 `json:"output"`
	Cached int64 `json:"cached,omitempty"`
}

// Total is the tokens a token budget counts: input and output.
func (t Tokens) Total() int64 { return t.Input + t.Output }

// Add is t and o summed.
func (t Tokens) Add(o Tokens) Tokens {
	return Tokens{Input: t.Input + o.Input, Output: t.Output + o.Output, Cached: t.Cached + o.Cached}
}

// Cost is what t costs at p: uncached input at Input, cached input at
// Cached (Input when unset), output at Output.
func (p Price) Cost(t Tokens) float64 {
	cached := p.Cached
	if cached == 0 {
		cached = p.Input
	}
	uncached := max(t.Input-t.Cached, 0)
	return (float64(uncached)*p.Input + float64(t.Cached)*cached + float64(t.Output)*p.Output) / 1e6
}

// Call is one provider call the proxy forwarded (or refused for a
// budget), as it reports it to the scheduler: never a key, a prompt or an
// answer.
type Call struct {
	// Seq numbers the proxy's calls from 1: an allowance the scheduler
	// sends back says which calls it has counted (Allowance.AsOf).
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	Provider string    `json:"provider"`
	Model    string    `json:"model"`
	Endpoint string    `json:"endpoint,omitempty"`
	// Status is the provider's HTTP status (0: no answer).
	Status  int   `json:"status"`
	Latency int64 `json:"latency_ms"`
	Tokens
	Cost float64 `json:"cost"`
	// Priced says whether [providers.X.prices] had the model.
	Priced bool `json:"priced,omitempty"`
	// UsageUnknown: the answer said nothing the proxy could read as usage.
	UsageUnknown bool `json:"usage_unknown,omitempty"`
	// Budget names the budget that refused the call (it was never sent),
	// BudgetReason says why in the words the agent saw.
	Budget       string `json:"budget,omitempty"`
	BudgetReason string `json:"budget_reason,omitempty"`
}

// ModelUsage is one model's part of a Usage.
type ModelUsage struct {
	Provider string `json:"provider"`
	Model    string `json:"model"`
	Calls    int    `json:"calls"`
	Errors   int    `json:"errors,omitempty"`
	Tokens
	Cost float64 `json:"cost"`
}

// Usage is what a run (or an agent's day) spent on providers: totals and
// per model, and the budget that stopped a call, if any.
type Usage struct {
	Calls int `json:"calls"`
	// Errors counts calls the provider answered with a status over 399.
	Errors int `json:"errors,omitempty"`
	Tokens
	Cost   float64      `json:"cost"`
	Models []ModelUsage `json:"models,omitempty"`
	// Refused counts calls a budget refused; Budget names the last budget
	// that did, BudgetReason says why, in words the agent saw.
	Refused      int    `json:"refused,omitempty"`
	Budget       string `json:"budget,omitempty"`
	BudgetReason string `json:"budget_reason,omitempty"`
	// Unpriced counts calls of a model [providers.X.prices] does not have.
	Unpriced int `json:"unpriced,omitempty"`
}

// maxModelsKept bounds Usage.Models: a run calls one or two models.
const maxModelsKept = 16

// Add counts c into u.
func (u *Usage) Add(c Call) {
	if c.Budget != "" {
		u.Refused++
		u.Budget, u.BudgetReason = c.Budget, c.BudgetReason
		return
	}
	u.Calls++
	errored := c.Status == 0 || c.Status >= 400
	if errored {
		u.Errors++
	}
	if !c.Priced && c.Total() > 0 {
		u.Unpriced++
	}
	u.Tokens = u.Tokens.Add(c.Tokens)
	u.Cost += c.Cost
	i := slices.IndexFunc(u.Models, func(m ModelUsage) bool { return m.Provider == c.Provider && m.Model == c.Model })
	if i < 0 {
		if len(u.Models) >= maxModelsKept {
			return
		}
		u.Models = append(u.Models, ModelUsage{Provider: c.Provider, Model: c.Model})
		i = len(u.Models) - 1
	}
	m := &u.Models[i]
	m.Calls++
	if errored {
		m.Errors++
	}
	m.Tokens = m.Tokens.Add(c.Tokens)
	m.Cost += c.Cost
}

// Merge adds o into u (an agent's day from its runs).
func (u *Usage) Merge(o Usage) {
	u.Calls += o.Calls
	u.Errors += o.Errors
	u.Tokens = u.Tokens.Add(o.Tokens)
	u.Cost += o.Cost
	u.Refused += o.Refused
	u.Unpriced += o.Unpriced
	if o.Budget != "" {
		u.Budget, u.BudgetReason = o.Budget, o.BudgetReason
	}
	for _, om := range o.Models {
		i := slices.IndexFunc(u.Models, func(m ModelUsage) bool { return m.Provider == om.Provider && m.Model == om.Model })
		if i < 0 {
			if len(u.Models) < maxModelsKept {
				u.Models = append(u.Models, om)
			}
			continue
		}
		m := &u.Models[i]
		m.Calls += om.Calls
		m.Errors += om.Errors
		m.Tokens = m.Tokens.Add(om.Tokens)
		m.Cost += om.Cost
	}
	slices.SortFunc(u.Models, func(a, b ModelUsage) int {
		return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Model, b.Model))
	})
}

// Zero says whether u counts nothing.
func (u Usage) Zero() bool { return u.Calls == 0 && u.Refused == 0 }

// Budget names: the keys of [agents.budget], and what a refusal names.
const (
	BudgetTokensPerDay      = "tokens_per_day"
	BudgetCostPerDay        = "cost_per_day"
	BudgetCostPerRun        = "cost_per_run"
	BudgetRequestsPerMinute = "requests_per_minute"
)

// Budget is an agent's [agents.budget]: 0 is no limit.
type Budget struct {
	TokensPerDay      int64   `json:"tokens_per_day,omitempty"`
	CostPerDay        float64 `json:"cost_per_day,omitempty"`
	CostPerRun        float64 `json:"cost_per_run,omitempty"`
	RequestsPerMinute int     `json:"requests_per_minute,omitempty"`
}

// Limited says whether b limits anything.
func (b Budget) Limited() bool {
	return b.TokensPerDay > 0 || b.CostPerDay > 0 || b.CostPerRun > 0 || b.RequestsPerMinute > 0
}

// Allowance is what a run's proxy may still spend: the agent's budget and
// what is left of each limit, as the scheduler counted it after the
// proxy's call AsOf (its later calls the proxy subtracts itself). Left
// values mean nothing where the budget has no limit.
type Allowance struct {
	Budget     Budget  `json:"budget"`
	AsOf       uint64  `json:"as_of"`
	TokensLeft int64   `json:"tokens_left"`
	CostLeft   float64 `json:"cost_left"`
	RunLeft    float64 `json:"run_left"`
	// Day is the day (UTC, 2006-01-02) the day figures are of.
	Day string `json:"day,omitempty"`
}
