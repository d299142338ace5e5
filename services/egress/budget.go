package egress

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// budgetState is what a run's proxy may still spend on provider calls
// (docs/adr/0024-usage-and-budgets.md): the scheduler's last allowance,
// less the calls the proxy reported after it, and the calls of the last
// minute for requests_per_minute. Every call is numbered as it is
// reported, so an allowance says which calls it has counted.
type budgetState struct {
	clock clockwork.Clock

	mu      sync.Mutex
	allow   *egresspolicy.Allowance // nil: no budget
	pending []egresspolicy.Call     // reported after allow.AsOf
	recent  []time.Time             // admitted calls of the last minute
	seq     uint64                  // the last call reported
}

// budgetRefusal is a call a budget refuses: which budget, why, and when
// the sandbox may try again (requests_per_minute only).
type budgetRefusal struct {
	budget     string
	reason     string
	retryAfter time.Duration
}

// set takes a new allowance from the scheduler.
func (b *budgetState) set(a egresspolicy.Allowance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.allow = &a
	kept := b.pending[:0]
	for _, c := range b.pending {
		if c.Seq > a.AsOf {
			kept = append(kept, c)
		}
	}
	b.pending = kept
}

// admit says whether a provider call may be sent now; an admitted call
// counts towards requests_per_minute.
func (b *budgetState) admit() *budgetRefusal {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.allow == nil {
		return nil
	}
	a, lim := *b.allow, b.allow.Budget
	var tokens int64
	var cost float64
	for _, c := range b.pending {
		tokens += c.Total()
		cost += c.Cost
	}
	switch {
	case lim.TokensPerDay > 0 && a.TokensLeft-tokens <= 0:
		return &budgetRefusal{budget: egresspolicy.BudgetTokensPerDay,
			reason: fmt.Sprintf("the agent's budget tokens_per_day (%d) is used up for today (UTC)", lim.TokensPerDay)}
	case lim.CostPerDay > 0 && a.CostLeft-cost <= 0:
		return &budgetRefusal{budget: egresspolicy.BudgetCostPerDay,
			reason: fmt.Sprintf("the agent's budget cost_per_day (%s) is used up for today (UTC)", money(lim.CostPerDay))}
	case lim.CostPerRun > 0 && a.RunLeft-cost <= 0:
		return &budgetRefusal{budget: egresspolicy.BudgetCostPerRun,
			reason: fmt.Sprintf("the run's budget cost_per_run (%s) is used up", money(lim.CostPerRun))}
	}
	if n := lim.RequestsPerMinute; n > 0 {
		now := b.clock.Now()
		cut := 0
		for cut < len(b.recent) && !b.recent[cut].After(now.Add(-time.Minute)) {
			cut++
		}
		b.recent = append(b.recent[:0], b.recent[cut:]...)
		if len(b.recent) >= n {
			return &budgetRefusal{budget: egresspolicy.BudgetRequestsPerMinute,
				reason:     fmt.Sprintf("the agent's budget requests_per_minute (%d) is reached; retry in a moment", n),
				retryAfter: b.recent[0].Add(time.Minute).Sub(now)}
		}
		b.recent = append(b.recent, now)
	}
	return nil
}

// reported numbers c and keeps it until an allowance counts it.
func (b *budgetState) reported(c egresspolicy.Call) egresspolicy.Call {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	c.Seq = b.seq
	if b.allow != nil && c.Budget == "" {
		b.pending = append(b.pending, c)
	}
	return c
}

func money(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// refuseBudget answers a provider call a budget refused in the provider's
// own error format, so the agent's SDK shows the reason: 429 with
// Retry-After for requests_per_minute, 403 for a budget that holds until
// tomorrow or the run's end (an SDK retries a 429, not a 403).
func (s *Server) refuseBudget(w http.ResponseWriter, d egresspolicy.Decision, p *Provider, r *budgetRefusal) {
	d.Allowed, d.Reason = false, "budget "+r.budget+": "+r.reason
	s.record(d)
	code := http.StatusForbidden
	if r.budget == egresspolicy.BudgetRequestsPerMinute {
		code = http.StatusTooManyRequests
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(r.retryAfter, time.Second).Seconds()))))
	}
	msg := "berth: " + r.reason + " (budget " + r.budget + "; an admin can raise it with berthctl budget set)"
	var body any
	if p.Kind == "anthropic" {
		typ := "permission_error"
		if code == http.StatusTooManyRequests {
			typ = "rate_limit_error"
		}
		body = map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}}
	} else {
		body = map[string]any{"error": map[string]any{"message": msg, "type": "insufficient_quota", "code": "berth_budget_" + r.budget, "param": nil}}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Berth-Egress", "refused")
	w.Header().Set("X-Berth-Budget", r.budget)
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}
