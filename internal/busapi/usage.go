package busapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
)

// Usage is what provider calls spent (a run's, Run.Usage; an agent's day,
// UsageDay): tokens, cost from [providers.X.prices], per model, and the
// budget that stopped a call (docs/adr/0024-usage-and-budgets.md).
type Usage struct {
	Calls        int          `json:"calls"`
	Errors       int          `json:"errors,omitempty"`
	Input        int64        `json:"input"`
	Output       int64        `json:"output"`
	Cached       int64        `json:"cached,omitempty"`
	Cost         float64      `json:"cost"`
	Models       []ModelUsage `json:"models,omitempty"`
	Refused      int          `json:"refused,omitempty"`
	Budget       string       `json:"budget,omitempty"`
	BudgetReason string       `json:"budget_reason,omitempty"`
	Unpriced     int          `json:"unpriced,omitempty"`
}

// ModelUsage is one model's part of a Usage.
type ModelUsage struct {
	Provider string  `json:"provider"`
	Model    string  `json:"model"`
	Calls    int     `json:"calls"`
	Errors   int     `json:"errors,omitempty"`
	Input    int64   `json:"input"`
	Output   int64   `json:"output"`
	Cached   int64   `json:"cached,omitempty"`
	Cost     float64 `json:"cost"`
}

// Wire is u as JSON (Run's usage, UsageDay's usage).
func (u Usage) Wire() string {
	b, _ := json.Marshal(u)
	return string(b)
}

// RunUsage decodes a run's usage; a run without provider calls has none.
func (r Run) RunUsage() (*Usage, error) {
	if r.Usage.Text == "" || r.Usage.Text == "null" {
		return nil, nil
	}
	var u Usage
	if err := json.Unmarshal([]byte(r.Usage.Text), &u); err != nil {
		return nil, fmt.Errorf("cannot read the usage of run %s: %w", r.ID, err)
	}
	return &u, nil
}

// UsageDay is one agent's provider spending on one day (UTC), as
// dev.berth.Scheduler1.Usage lists it.
type UsageDay struct {
	Agent string `json:"agent"`
	Day   string `json:"day"` // 2006-01-02
	Usage Usage  `json:"usage"`
}

// Wire is d as an a{sv} entry of Usage.
func (d UsageDay) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"agent": dbus.MakeVariant(d.Agent),
		"day":   dbus.MakeVariant(d.Day),
		"usage": dbus.MakeVariant(d.Usage.Wire()),
	}
}

// UsageDayFromWire reads one entry of Usage.
func UsageDayFromWire(m map[string]dbus.Variant) (UsageDay, error) {
	var d UsageDay
	var raw string
	f := fields{m: m}
	f.str("agent", &d.Agent)
	f.str("day", &d.Day)
	f.str("usage", &raw)
	if f.err != nil {
		return UsageDay{}, fmt.Errorf("cannot read a usage day: %w", f.err)
	}
	if err := json.Unmarshal([]byte(raw), &d.Usage); err != nil {
		return UsageDay{}, fmt.Errorf("cannot read the usage of %s on %s: %w", d.Agent, d.Day, err)
	}
	return d, nil
}

// Budget is one agent's budget as it holds now ([agents.budget] with what
// an admin raised live, Raised naming those keys; 0 is no limit) and what
// the agent spent today.
type Budget struct {
	Agent             string   `json:"agent"`
	Day               string   `json:"day"`
	TokensPerDay      int64    `json:"tokens_per_day"`
	CostPerDay        float64  `json:"cost_per_day"`
	CostPerRun        float64  `json:"cost_per_run"`
	RequestsPerMinute uint32   `json:"requests_per_minute"`
	Raised            []string `json:"raised,omitempty"`
	TokensUsed        int64    `json:"tokens_used"`
	CostUsed          float64  `json:"cost_used"`
	Calls             uint32   `json:"calls"`
	Refused           uint32   `json:"refused"`
}

// Wire is b as an a{sv} entry of GetBudgets.
func (b Budget) Wire() map[string]dbus.Variant {
	raised := b.Raised
	if raised == nil {
		raised = []string{}
	}
	return map[string]dbus.Variant{
		"agent":               dbus.MakeVariant(b.Agent),
		"day":                 dbus.MakeVariant(b.Day),
		"tokens_per_day":      dbus.MakeVariant(b.TokensPerDay),
		"cost_per_day":        dbus.MakeVariant(b.CostPerDay),
		"cost_per_run":        dbus.MakeVariant(b.CostPerRun),
		"requests_per_minute": dbus.MakeVariant(b.RequestsPerMinute),
		"raised":              dbus.MakeVariant(raised),
		"tokens_used":         dbus.MakeVariant(b.TokensUsed),
		"cost_used":           dbus.MakeVariant(b.CostUsed),
		"calls":               dbus.MakeVariant(b.Calls),
		"refused":             dbus.MakeVariant(b.Refused),
	}
}

// BudgetFromWire reads one entry of GetBudgets.
func BudgetFromWire(m map[string]dbus.Variant) (Budget, error) {
	var b Budget
	f := fields{m: m}
	f.str("agent", &b.Agent)
	f.str("day", &b.Day)
	f.get("tokens_per_day", &b.TokensPerDay)
	f.get("cost_per_day", &b.CostPerDay)
	f.get("cost_per_run", &b.CostPerRun)
	f.u32("requests_per_minute", &b.RequestsPerMinute)
	f.get("raised", &b.Raised)
	f.get("tokens_used", &b.TokensUsed)
	f.get("cost_used", &b.CostUsed)
	f.u32("calls", &b.Calls)
	f.u32("refused", &b.Refused)
	if f.err != nil {
		return Budget{}, fmt.Errorf("cannot read a budget: %w", f.err)
	}
	return b, nil
}

// Usage is agent's ("" for every agent) spending per day since since
// (UTC days), oldest first.
func (s Scheduler) Usage(ctx context.Context, agent string, since time.Time) ([]UsageDay, error) {
	var raw []map[string]dbus.Variant
	if err := s.call(ctx, "Usage", []any{agent, usecOf(since)}, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, UsageDayFromWire)
}

// GetBudgets is agent's budget ("" for every agent's) and today's spending.
func (s Scheduler) GetBudgets(ctx context.Context, agent string) ([]Budget, error) {
	var raw []map[string]dbus.Variant
	if err := s.call(ctx, "GetBudgets", []any{agent}, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, BudgetFromWire)
}

// SetBudget changes one key of agent's budget live (value a number, 0 for
// no limit, or "default" for berth.toml's); live runs get it at once.
func (s Scheduler) SetBudget(ctx context.Context, agent, key, value string) error {
	return s.call(ctx, "SetBudget", []any{agent, key, value})
}

func usecOf(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMicro())
}
