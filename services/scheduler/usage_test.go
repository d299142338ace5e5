package scheduler

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// takenAllowances stands in for a run's proxy: it keeps the allowances the
// scheduler hands it, as berth-egress does on its stdin.
type takenAllowances struct {
	mu  sync.Mutex
	got []egresspolicy.Allowance
}

func (a *takenAllowances) SetAllowance(al egresspolicy.Allowance) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, al)
	return nil
}

func (a *takenAllowances) last(t *testing.T) egresspolicy.Allowance {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.got) == 0 {
		t.Fatal("no allowance was handed to the proxy")
	}
	return a.got[len(a.got)-1]
}

func budgetConfig(b config.BudgetSettings) *config.Config {
	cfg := testConfig(2)
	cfg.Agents[0].Budget = b
	return cfg
}

// call is a reported call and its counting done (what the proxy's
// OnCall starts, waited for through the run's end).
func countNow(s *Service, sp *spend, c egresspolicy.Call) { s.countCall(sp, c) }

func TestConcurrentRunsOfAnAgentShareItsDayAndARestartKeepsIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	tokens := 1000
	cfg := budgetConfig(config.BudgetSettings{TokensPerDay: &tokens})
	s := newTestService(t, cfg, dir, newGateBackend("landlock"), nil, withClock(clock))

	one, spendOne := s.beginSpend(cfg, "alpha")
	two, _ := s.beginSpend(cfg, "alpha")
	if a := spendOne.Allowance; a == nil || a.TokensLeft != 1000 || a.Budget.TokensPerDay != 1000 {
		t.Fatalf("first allowance %+v, want 1000 left", a)
	}
	p1, p2 := &takenAllowances{}, &takenAllowances{}
	one.attach(p1)
	two.attach(p2)
	countNow(s, one, egresspolicy.Call{Seq: 1, Provider: "openai", Model: "m", Status: 200, Tokens: egresspolicy.Tokens{Input: 300, Output: 100}, Cost: 0.01})
	// The other run's proxy learns at once what the first spent.
	if a := p2.last(t); a.TokensLeft != 600 || a.AsOf != 0 {
		t.Fatalf("the other run's allowance %+v, want 600 left as of none of its own calls", a)
	}
	if a := p1.last(t); a.TokensLeft != 600 || a.AsOf != 1 {
		t.Fatalf("the calling run's allowance %+v, want 600 left as of its call 1", a)
	}
	// Counted out of order: the mark waits for the gap.
	countNow(s, two, egresspolicy.Call{Seq: 2, Status: 200, Tokens: egresspolicy.Tokens{Input: 50}})
	if a := p2.last(t); a.AsOf != 0 || a.TokensLeft != 550 {
		t.Fatalf("after call 2 alone: %+v, want as of 0 (call 1 not counted yet)", a)
	}
	countNow(s, two, egresspolicy.Call{Seq: 1, Status: 200, Tokens: egresspolicy.Tokens{Input: 50}})
	if a := p2.last(t); a.AsOf != 2 || a.TokensLeft != 500 {
		t.Fatalf("after calls 1 and 2: %+v, want as of 2 and 500 left", a)
	}
	s.endSpend(one)
	s.endSpend(two)
	s.Close()

	// A restarted scheduler starts the agent's next run with what is left.
	s = newTestService(t, cfg, dir, newGateBackend("landlock"), nil, withClock(clock))
	_, sp := s.beginSpend(cfg, "alpha")
	if sp.Allowance == nil || sp.Allowance.TokensLeft != 500 {
		t.Fatalf("after a restart: %+v, want 500 left", sp.Allowance)
	}
	days, err := s.UsageDays("alpha", time.Time{})
	if err != nil || len(days) != 1 || days[0].Day != "2026-12-02" || days[0].Usage.Calls != 3 || days[0].Usage.Input != 400 {
		t.Fatalf("usage days %+v, %v", days, err)
	}
	// The next day (the injected clock) starts afresh.
	clock.Advance(24 * time.Hour)
	if _, sp := s.beginSpend(cfg, "alpha"); sp.Allowance.TokensLeft != 1000 || sp.Allowance.Day != "2026-12-03" {
		t.Fatalf("the next day: %+v, want 1000 left", sp.Allowance)
	}
}

func TestAnAdminRaisesABudgetLiveAndItOutlivesARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cost := 1.0
	cfg := budgetConfig(config.BudgetSettings{CostPerDay: &cost})
	s := newTestService(t, cfg, dir, newGateBackend("landlock"), nil)
	sp, _ := s.beginSpend(cfg, "alpha")
	p := &takenAllowances{}
	sp.attach(p)
	countNow(s, sp, egresspolicy.Call{Seq: 1, Status: 200, Tokens: egresspolicy.Tokens{Input: 10}, Cost: 1.2})
	if a := p.last(t); a.CostLeft > 0 {
		t.Fatalf("allowance %+v, want nothing left", a)
	}
	if err := s.SetBudget("alpha", "cost_per_day", "5"); err != nil {
		t.Fatal(err)
	}
	if a := p.last(t); a.Budget.CostPerDay != 5 || a.CostLeft < 3.79 || a.CostLeft > 3.81 {
		t.Fatalf("after the raise the live proxy has %+v, want 3.8 left of 5", a)
	}
	for _, bad := range [][2]string{{"cost_per_week", "5"}, {"cost_per_day", "-1"}, {"cost_per_day", "lots"}} {
		if err := s.SetBudget("alpha", bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), "invalid") && !strings.Contains(err.Error(), "unknown") {
			t.Errorf("SetBudget(%s, %s) = %v, want it refused", bad[0], bad[1], err)
		}
	}
	if err := s.SetBudget("nobody", "cost_per_day", "5"); err == nil {
		t.Error("a budget of an agent that is not configured was set")
	}
	s.endSpend(sp)
	s.Close()

	s = newTestService(t, cfg, dir, newGateBackend("landlock"), nil)
	bs, err := s.Budgets("alpha")
	if err != nil || len(bs) != 1 || bs[0].CostPerDay != 5 || len(bs[0].Raised) != 1 || bs[0].Raised[0] != "cost_per_day" || bs[0].CostUsed < 1.19 {
		t.Fatalf("budgets after a restart %+v, %v", bs, err)
	}
	if err := s.SetBudget("alpha", "cost_per_day", "default"); err != nil {
		t.Fatal(err)
	}
	if bs, _ := s.Budgets("alpha"); bs[0].CostPerDay != 1 || len(bs[0].Raised) != 0 {
		t.Fatalf("back to berth.toml's: %+v", bs[0])
	}
}

// A proxy started without a budget gets one once the admin sets one.
func TestABudgetSetLiveReachesARunThatStartedWithout(t *testing.T) {
	t.Parallel()
	cfg := testConfig(1)
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil)
	sp, spending := s.beginSpend(cfg, "alpha")
	if spending.Allowance != nil {
		t.Fatalf("an agent without a budget got an allowance %+v", spending.Allowance)
	}
	p := &takenAllowances{}
	sp.attach(p)
	if err := s.SetBudget("alpha", "requests_per_minute", "3"); err != nil {
		t.Fatal(err)
	}
	if a := p.last(t); a.Budget.RequestsPerMinute != 3 {
		t.Fatalf("allowance %+v, want requests_per_minute 3", a)
	}
}

func TestUsageDaysArePrunedByTheRetentionPass(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	cfg := testConfig(1)
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil, withClock(clock))
	sp, _ := s.beginSpend(cfg, "alpha")
	countNow(s, sp, egresspolicy.Call{Seq: 1, Status: 200, Tokens: egresspolicy.Tokens{Input: 1}})
	clock.Advance((usageDays + 1) * 24 * time.Hour)
	countNow(s, sp, egresspolicy.Call{Seq: 2, Status: 200, Tokens: egresspolicy.Tokens{Input: 1}})
	if days, _ := s.UsageDays("", time.Time{}); len(days) != 2 {
		t.Fatalf("days before the pass: %+v", days)
	}
	if rep := s.prune(t.Context()); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	days, _ := s.UsageDays("", time.Time{})
	if len(days) != 1 || days[0].Day != dayOf(clock.Now()) {
		t.Fatalf("days after the pass: %+v, want today's only", days)
	}
}

func TestABudgetStopIsSaidWhereTheConversationReadsIt(t *testing.T) {
	t.Parallel()
	u := egresspolicy.Usage{Calls: 1, Refused: 1, Budget: "tokens_per_day", BudgetReason: "the agent's budget tokens_per_day (10) is used up for today (UTC)"}
	failed := Run{State: StateFailed, Reason: "provider error"}
	recordUsage(&failed, u)
	if !strings.Contains(replyText(failed), "failed: stopped by a budget: the agent's budget tokens_per_day (10) is used up") || failed.Usage == nil {
		t.Fatalf("failed run's reply %q", replyText(failed))
	}
	ok := Run{State: StateSucceeded, Reply: "I could not finish."}
	recordUsage(&ok, u)
	if !strings.HasPrefix(ok.Reply, "I could not finish.") || !strings.Contains(ok.Reply, "(berth: a model call was stopped: the agent's budget tokens_per_day (10)") {
		t.Fatalf("succeeded run's reply %q", ok.Reply)
	}
	quiet := Run{State: StateSucceeded, Reply: "done"}
	recordUsage(&quiet, egresspolicy.Usage{})
	if quiet.Usage != nil || quiet.Reply != "done" {
		t.Fatalf("a run without calls: %+v", quiet)
	}
}
