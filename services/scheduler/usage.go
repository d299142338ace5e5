package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runprep"
)

// Usage and budgets (docs/adr/0024-usage-and-budgets.md). Each run's
// egress proxy reports every provider call; the scheduler counts it into
// the agent's day in usage/ (so budgets survive restarts) and hands every
// live proxy of the agent what is left. Buckets, beside the others:
//
//	usage/   <agent> 0x00 <day, UTC 2006-01-02> → egresspolicy.Usage (JSON)
//	budgets/ <agent> → budgetOverride (JSON): what berthctl budget set raised
//
// Both are made on first write: a store that never saw a call has neither.
var (
	bucketUsage   = []byte("usage")
	bucketBudgets = []byte("budgets")
)

// usageDays is how many days of usage/ the retention pass keeps.
const usageDays = 400

func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

func usageKey(agent, day string) []byte { return []byte(agent + "\x00" + day) }

// budgetOverride is an admin's live change of an agent's budget: each key
// set replaces the configured one until set back to "default".
type budgetOverride struct {
	TokensPerDay      *int64   `json:"tokens_per_day,omitempty"`
	CostPerDay        *float64 `json:"cost_per_day,omitempty"`
	CostPerRun        *float64 `json:"cost_per_run,omitempty"`
	RequestsPerMinute *int     `json:"requests_per_minute,omitempty"`
}

func (o budgetOverride) apply(b egresspolicy.Budget) egresspolicy.Budget {
	if o.TokensPerDay != nil {
		b.TokensPerDay = *o.TokensPerDay
	}
	if o.CostPerDay != nil {
		b.CostPerDay = *o.CostPerDay
	}
	if o.CostPerRun != nil {
		b.CostPerRun = *o.CostPerRun
	}
	if o.RequestsPerMinute != nil {
		b.RequestsPerMinute = *o.RequestsPerMinute
	}
	return b
}

func (o budgetOverride) keys() []string {
	var ks []string
	if o.TokensPerDay != nil {
		ks = append(ks, egresspolicy.BudgetTokensPerDay)
	}
	if o.CostPerDay != nil {
		ks = append(ks, egresspolicy.BudgetCostPerDay)
	}
	if o.CostPerRun != nil {
		ks = append(ks, egresspolicy.BudgetCostPerRun)
	}
	if o.RequestsPerMinute != nil {
		ks = append(ks, egresspolicy.BudgetRequestsPerMinute)
	}
	return ks
}

// spendBook is every live egress proxy, by agent, that the scheduler
// hands allowances to.
type spendBook struct {
	mu   sync.Mutex
	live map[string]map[*spend]struct{}
}

// allowanceTaker is a run's prepared proxy (runprep.Prepared).
type allowanceTaker interface {
	SetAllowance(egresspolicy.Allowance) error
}

// spend is one live proxy's account: which of its calls are counted, and
// what its current run has spent.
type spend struct {
	agent string

	mu       sync.Mutex
	proxy    allowanceTaker
	counted  uint64          // every call up to this one is in usage/
	ahead    map[uint64]bool // counted calls past a gap
	runSpent float64
	limited  bool // it has been handed an allowance

	pending sync.WaitGroup // calls being counted
}

// count marks call seq counted and moves the mark past every counted one.
func (sp *spend) count(seq uint64, cost float64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.runSpent += cost
	if seq != sp.counted+1 {
		if sp.ahead == nil {
			sp.ahead = map[uint64]bool{}
		}
		sp.ahead[seq] = true
		return
	}
	sp.counted = seq
	for sp.ahead[sp.counted+1] {
		delete(sp.ahead, sp.counted+1)
		sp.counted++
	}
}

// beginSpend registers a run's (or a kept sandbox's) proxy-to-be of
// agent: what it may spend to start with and who hears its calls. Call
// attach once it is prepared and endSpend once its proxy has stopped.
func (s *Service) beginSpend(cfg *config.Config, agent string) (*spend, runprep.Spending) {
	sp := &spend{agent: agent}
	s.spends.mu.Lock()
	if s.spends.live == nil {
		s.spends.live = map[string]map[*spend]struct{}{}
	}
	if s.spends.live[agent] == nil {
		s.spends.live[agent] = map[*spend]struct{}{}
	}
	s.spends.live[agent][sp] = struct{}{}
	s.spends.mu.Unlock()
	out := runprep.Spending{OnCall: func(c egresspolicy.Call) {
		s.metrics.observeCall(agent, c)
		// The proxy's reader must not wait for the store.
		sp.pending.Add(1)
		go func() {
			defer sp.pending.Done()
			s.countCall(sp, c)
		}()
	}}
	budget, err := s.budgetOf(cfg, agent)
	if err != nil {
		s.log.Error("cannot read the agent's budget; the run starts with none spent", "agent", agent, "err", err)
	}
	if budget.Limited() {
		day, err := s.dayUsage(agent, dayOf(s.clock.Now()))
		if err != nil {
			// Fails closed: nothing left until the store answers.
			s.log.Error("cannot read the agent's usage today; its run may spend nothing until it can", "agent", agent, "err", err)
			day.Tokens.Input, day.Cost = budget.TokensPerDay, budget.CostPerDay
		}
		a := allowanceOf(budget, day, 0, 0, dayOf(s.clock.Now()))
		out.Allowance = &a
		sp.limited = true
	}
	return sp, out
}

// attach gives sp the prepared run whose proxy it accounts.
func (sp *spend) attach(p allowanceTaker) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.proxy = p
	sp.mu.Unlock()
}

// endSpend waits until every call sp's proxy reported is counted and
// forgets sp. Its proxy has stopped (all its calls are read).
func (s *Service) endSpend(sp *spend) {
	if sp == nil {
		return
	}
	sp.pending.Wait()
	s.spends.mu.Lock()
	delete(s.spends.live[sp.agent], sp)
	if len(s.spends.live[sp.agent]) == 0 {
		delete(s.spends.live, sp.agent)
	}
	s.spends.mu.Unlock()
	sp.mu.Lock()
	sp.proxy = nil
	sp.mu.Unlock()
}

// newRun starts a new run's cost_per_run on a kept sandbox's proxy.
func (s *Service) newSpendRun(sp *spend) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.runSpent = 0
	sp.mu.Unlock()
	s.pushAllowances(sp.agent)
}

// countCall adds one reported call to its agent's day and tells every
// live proxy of the agent what is left.
func (s *Service) countCall(sp *spend, c egresspolicy.Call) {
	day := dayOf(s.clock.Now())
	err := s.store.write(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketUsage)
		if err != nil {
			return err
		}
		var u egresspolicy.Usage
		key := usageKey(sp.agent, day)
		if v := b.Get(key); v != nil {
			if err := json.Unmarshal(v, &u); err != nil {
				return fmt.Errorf("cannot decode the usage of %s on %s: %w", sp.agent, day, err)
			}
		}
		u.Add(c)
		v, err := json.Marshal(u)
		if err != nil {
			return err
		}
		return b.Put(key, v)
	})
	if err != nil {
		// The call stays uncounted: the proxy keeps holding it against
		// the allowance it has (it is past the mark).
		s.log.Error("cannot count a provider call", "agent", sp.agent, "provider", c.Provider, "model", c.Model, "err", err)
		return
	}
	sp.count(c.Seq, c.Cost)
	s.pushAllowances(sp.agent)
}

// pushAllowances hands each live proxy of agent what is left of its
// budget now; a proxy that never had one gets one only once the agent
// has a budget.
func (s *Service) pushAllowances(agent string) {
	s.spends.mu.Lock()
	var live []*spend
	for sp := range s.spends.live[agent] {
		live = append(live, sp)
	}
	s.spends.mu.Unlock()
	if len(live) == 0 {
		return
	}
	budget, err := s.budgetOf(s.cfg.Load(), agent)
	if err != nil {
		s.log.Error("cannot read the agent's budget", "agent", agent, "err", err)
		return
	}
	today := dayOf(s.clock.Now())
	day, err := s.dayUsage(agent, today)
	if err != nil {
		s.log.Error("cannot read the agent's usage today", "agent", agent, "err", err)
		return
	}
	for _, sp := range live {
		sp.mu.Lock()
		proxy, asOf, runSpent := sp.proxy, sp.counted, sp.runSpent
		send := proxy != nil && (budget.Limited() || sp.limited)
		if send {
			sp.limited = true
		}
		sp.mu.Unlock()
		if !send {
			continue
		}
		a := allowanceOf(budget, day, asOf, runSpent, today)
		if err := proxy.SetAllowance(a); err != nil {
			s.log.Debug("cannot hand a proxy its allowance (it has stopped?)", "agent", agent, "err", err)
		}
	}
}

func allowanceOf(b egresspolicy.Budget, day egresspolicy.Usage, asOf uint64, runSpent float64, today string) egresspolicy.Allowance {
	return egresspolicy.Allowance{Budget: b, AsOf: asOf, Day: today,
		TokensLeft: b.TokensPerDay - day.Total(), CostLeft: b.CostPerDay - day.Cost, RunLeft: b.CostPerRun - runSpent}
}

// budgetOf is agent's budget: [agents.budget], with what an admin raised
// live.
func (s *Service) budgetOf(cfg *config.Config, agent string) (egresspolicy.Budget, error) {
	var b egresspolicy.Budget
	if a, err := cfg.Agent(agent); err == nil {
		b = a.Budget
	}
	o, err := s.budgetOverrideOf(agent)
	return o.apply(b), err
}

func (s *Service) budgetOverrideOf(agent string) (budgetOverride, error) {
	var o budgetOverride
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBudgets)
		if b == nil {
			return nil
		}
		if v := b.Get([]byte(agent)); v != nil {
			return json.Unmarshal(v, &o)
		}
		return nil
	})
	if err != nil {
		return budgetOverride{}, fmt.Errorf("cannot read the budget of %s: %w", agent, err)
	}
	return o, nil
}

// dayUsage is what agent spent on day.
func (s *Service) dayUsage(agent, day string) (egresspolicy.Usage, error) {
	var u egresspolicy.Usage
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketUsage)
		if b == nil {
			return nil
		}
		if v := b.Get(usageKey(agent, day)); v != nil {
			return json.Unmarshal(v, &u)
		}
		return nil
	})
	if err != nil {
		return egresspolicy.Usage{}, fmt.Errorf("cannot read the usage of %s on %s: %w", agent, day, err)
	}
	return u, nil
}

// errUnknownBudgetKey: SetBudget's key is none of [agents.budget]'s.
var errUnknownBudgetKey = errors.New("unknown budget key")

// SetBudget changes one key of agent's budget live ("default" goes back
// to berth.toml's): kept in scheduler.db, handed to every live proxy of
// the agent at once, and to every run it starts.
func (s *Service) SetBudget(agent, key, value string) error {
	if _, err := s.cfg.Load().Agent(agent); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	reset := value == "default"
	var f float64
	if !reset {
		var err error
		if f, err = strconv.ParseFloat(value, 64); err != nil || f < 0 || f != f {
			return fmt.Errorf("%w: %s must be a number of 0 (no limit) or more, or \"default\", not %q", ErrInvalidArgument, key, value)
		}
	}
	err := s.store.write(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketBudgets)
		if err != nil {
			return err
		}
		var o budgetOverride
		if v := b.Get([]byte(agent)); v != nil {
			if err := json.Unmarshal(v, &o); err != nil {
				return err
			}
		}
		switch key {
		case egresspolicy.BudgetTokensPerDay:
			o.TokensPerDay = nil
			if !reset {
				n := int64(f)
				o.TokensPerDay = &n
			}
		case egresspolicy.BudgetCostPerDay:
			o.CostPerDay = nil
			if !reset {
				o.CostPerDay = &f
			}
		case egresspolicy.BudgetCostPerRun:
			o.CostPerRun = nil
			if !reset {
				o.CostPerRun = &f
			}
		case egresspolicy.BudgetRequestsPerMinute:
			o.RequestsPerMinute = nil
			if !reset {
				n := int(f)
				o.RequestsPerMinute = &n
			}
		default:
			return fmt.Errorf("%w %q (known: %s, %s, %s, %s)", errUnknownBudgetKey, key, egresspolicy.BudgetTokensPerDay,
				egresspolicy.BudgetCostPerDay, egresspolicy.BudgetCostPerRun, egresspolicy.BudgetRequestsPerMinute)
		}
		if len(o.keys()) == 0 {
			return b.Delete([]byte(agent))
		}
		v, err := json.Marshal(o)
		if err != nil {
			return err
		}
		return b.Put([]byte(agent), v)
	})
	if errors.Is(err, errUnknownBudgetKey) {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err != nil {
		return fmt.Errorf("cannot change the budget of %s: %w", agent, err)
	}
	s.log.Info("budget changed live", "agent", agent, "key", key, "value", value)
	s.pushAllowances(agent)
	return nil
}

// Budgets are the budgets of agent ("" for every configured agent) with
// what each spent today.
func (s *Service) Budgets(agent string) ([]busapi.Budget, error) {
	cfg := s.cfg.Load()
	ids := cfg.AgentIDs()
	if agent != "" {
		if _, err := cfg.Agent(agent); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		ids = []string{agent}
	}
	today := dayOf(s.clock.Now())
	var out []busapi.Budget
	for _, id := range ids {
		a, _ := cfg.Agent(id)
		o, err := s.budgetOverrideOf(id)
		if err != nil {
			return nil, err
		}
		u, err := s.dayUsage(id, today)
		if err != nil {
			return nil, err
		}
		eff := o.apply(a.Budget)
		out = append(out, busapi.Budget{Agent: id, Day: today, TokensPerDay: eff.TokensPerDay, CostPerDay: eff.CostPerDay,
			CostPerRun: eff.CostPerRun, RequestsPerMinute: uint32(eff.RequestsPerMinute), Raised: o.keys(),
			TokensUsed: u.Total(), CostUsed: u.Cost, Calls: uint32(u.Calls), Refused: uint32(u.Refused)})
	}
	return out, nil
}

// UsageDays are the days of usage/ of agent ("" for all) from since on,
// oldest first, each agent's days together.
func (s *Service) UsageDays(agent string, since time.Time) ([]busapi.UsageDay, error) {
	from := dayOf(since)
	var out []busapi.UsageDay
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketUsage)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		var k, v []byte
		if agent != "" {
			k, v = c.Seek([]byte(agent + "\x00"))
		} else {
			k, v = c.First()
		}
		for ; k != nil; k, v = c.Next() {
			id, day, ok := bytes.Cut(k, []byte{0})
			if !ok {
				continue
			}
			if agent != "" && string(id) != agent {
				break
			}
			if string(day) < from {
				continue
			}
			var u egresspolicy.Usage
			if err := json.Unmarshal(v, &u); err != nil {
				return fmt.Errorf("cannot decode the usage of %s on %s: %w", id, day, err)
			}
			out = append(out, busapi.UsageDay{Agent: string(id), Day: string(day), Usage: usageWire(u)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read usage: %w", err)
	}
	return out, nil
}

// pruneUsage deletes the days of usage/ before cutoff (retention.go).
func (s *Service) pruneUsage(ctx context.Context, cutoff time.Time) (int, error) {
	before := dayOf(cutoff)
	var old [][]byte
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketUsage)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			if _, day, ok := bytes.Cut(k, []byte{0}); ok && string(day) < before {
				old = append(old, slices.Clone(k))
			}
			return nil
		})
	})
	if err != nil || len(old) == 0 {
		return 0, err
	}
	for chunk := range slices.Chunk(old, retentionBatch) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		err := s.store.write(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketUsage)
			for _, k := range chunk {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	return len(old), nil
}

// usageWire is u as the bus carries it.
func usageWire(u egresspolicy.Usage) busapi.Usage {
	out := busapi.Usage{Calls: u.Calls, Errors: u.Errors, Input: u.Input, Output: u.Output, Cached: u.Cached, Cost: u.Cost,
		Refused: u.Refused, Budget: u.Budget, BudgetReason: u.BudgetReason, Unpriced: u.Unpriced}
	for _, m := range u.Models {
		out.Models = append(out.Models, busapi.ModelUsage{Provider: m.Provider, Model: m.Model, Calls: m.Calls, Errors: m.Errors,
			Input: m.Input, Output: m.Output, Cached: m.Cached, Cost: m.Cost})
	}
	return out
}

// recordUsage puts a run's usage in its record and, when a budget stopped
// one of its calls, says so where the conversation reads it: a failed
// run's reason (the reply says "failed: <reason>"), or a line after the
// agent's own reply.
func recordUsage(cur *Run, u egresspolicy.Usage) {
	if u.Zero() {
		return
	}
	cur.Usage = &u
	if u.Budget == "" {
		return
	}
	notice := u.BudgetReason
	if notice == "" {
		notice = "the agent's budget " + u.Budget + " is used up"
	}
	switch cur.State {
	case StateFailed:
		cur.Reason = "stopped by a budget: " + notice
	case StateSucceeded:
		cur.Reply = strings.TrimRight(cur.Reply, "\n") + "\n\n(berth: a model call was stopped: " + notice + ")"
	}
}
