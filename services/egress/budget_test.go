package egress_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

// countingProvider answers OpenAI chat completions using in and out tokens
// each, and counts the calls that reached it.
func countingProvider(t *testing.T, in, out int) (*atomic.Int32, func(*http.Request) string) {
	var n atomic.Int32
	return &n, func(*http.Request) string {
		n.Add(1)
		return fmt.Sprintf(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, in, out)
	}
}

func TestATokenBudgetStopsTheCallAfterItIsUsedUpAndARaiseLetsItThrough(t *testing.T) {
	t.Parallel()
	reached, answer := countingProvider(t, 60, 20)
	srv := fakeProvider(t, answer)
	decisions := &streamed{}
	p, got := usageProxy(t, "openai", srv, &egresspolicy.Allowance{Budget: egresspolicy.Budget{TokensPerDay: 1000}, TokensLeft: 150},
		egress.Options{OnDecision: decisions.add})
	call := func() (int, string) {
		return do(t, p.origin(token), "POST", "http://egress/providers/llm/chat/completions", `{"model":"m1"}`)
	}
	for i := range 2 { // 150 left, then 70: each call is let through while something is left
		if code, body := call(); code != 200 {
			t.Fatalf("call %d: %d %s", i+1, code, body)
		}
		got.wait(t, i+1)
	}
	code, body := call()
	if code != http.StatusForbidden {
		t.Fatalf("the call past the budget got %d %s, want 403", code, body)
	}
	var oa struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(body), &oa); err != nil || oa.Error.Code != "berth_budget_tokens_per_day" || !strings.Contains(oa.Error.Message, "tokens_per_day (1000)") {
		t.Fatalf("the refusal is not OpenAI's error shape naming the budget: %s (%v)", body, err)
	}
	if reached.Load() != 2 {
		t.Fatalf("the provider saw %d calls, want 2: a refused call is never sent", reached.Load())
	}
	cs := got.wait(t, 3)
	if cs[2].Budget != egresspolicy.BudgetTokensPerDay || cs[2].Seq != 3 {
		t.Fatalf("the refused call's report = %+v", cs[2])
	}
	if !refusedFor(decisions.all(), "budget tokens_per_day") {
		t.Fatalf("no decision names the budget: %+v", decisions.all())
	}
	// The admin raises it: the scheduler hands the proxy a new figure,
	// counted up to call 2; no restart.
	p.srv.SetAllowance(egresspolicy.Allowance{Budget: egresspolicy.Budget{TokensPerDay: 5000}, TokensLeft: 5000 - 160, AsOf: 3})
	if code, body := call(); code != 200 {
		t.Fatalf("after the raise: %d %s", code, body)
	}
}

// An allowance counts the calls up to AsOf; the proxy still subtracts the
// ones after it, so a figure that crossed a call in flight loses nothing.
func TestAnAllowanceSubtractsTheCallsItHasNotCounted(t *testing.T) {
	t.Parallel()
	_, answer := countingProvider(t, 50, 0)
	srv := fakeProvider(t, answer)
	lim := egresspolicy.Budget{TokensPerDay: 1000}
	p, got := usageProxy(t, "openai", srv, &egresspolicy.Allowance{Budget: lim, TokensLeft: 1000}, egress.Options{})
	call := func() int {
		code, _ := do(t, p.origin(token), "POST", "http://egress/providers/llm/chat/completions", `{"model":"m1"}`)
		return code
	}
	call()
	call()
	got.wait(t, 2)
	// The scheduler counted call 1 only: 1000-50 left as of 1; call 2's 50
	// the proxy still holds against it. 60 left would pass without it.
	p.srv.SetAllowance(egresspolicy.Allowance{Budget: lim, TokensLeft: 50, AsOf: 1})
	if code := call(); code != http.StatusForbidden {
		t.Fatalf("got %d, want 403: call 2 was not subtracted", code)
	}
	p.srv.SetAllowance(egresspolicy.Allowance{Budget: lim, TokensLeft: 60, AsOf: 1})
	if code := call(); code != http.StatusOK {
		t.Fatalf("got %d, want 200 with 10 left", code)
	}
}

func TestACostBudgetPerRunCountsThePricedTokens(t *testing.T) {
	t.Parallel()
	_, answer := countingProvider(t, 100_000, 10_000) // 0.2 + 0.1 = 0.3 at 2/M in, 10/M out
	srv := fakeProvider(t, answer)
	p, got := usageProxy(t, "openai", srv, &egresspolicy.Allowance{Budget: egresspolicy.Budget{CostPerRun: 0.5}, RunLeft: 0.5}, egress.Options{})
	for i, want := range []int{200, 200, 403} {
		code, body := do(t, p.origin(token), "POST", "http://egress/providers/llm/chat/completions", `{"model":"m1"}`)
		if code != want {
			t.Fatalf("call %d: %d %s, want %d", i+1, code, body, want)
		}
		if want == 403 && !strings.Contains(body, "cost_per_run (0.5)") {
			t.Fatalf("the refusal does not name cost_per_run: %s", body)
		}
		got.wait(t, i+1)
	}
	if c := got.all()[0]; c.Cost < 0.2999 || c.Cost > 0.3001 {
		t.Fatalf("cost %v, want 0.3", c.Cost)
	}
}

func TestRequestsPerMinuteIsASlidingWindowOnTheClock(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	reached, answer := countingProvider(t, 1, 1)
	srv := fakeProvider(t, answer)
	p, _ := usageProxy(t, "anthropic", srv, &egresspolicy.Allowance{Budget: egresspolicy.Budget{RequestsPerMinute: 2}}, egress.Options{Clock: clock})
	call := func() (int, http.Header) {
		req, _ := http.NewRequest("POST", "http://egress/providers/llm/v1/messages", strings.NewReader(`{"model":"m1"}`))
		resp, err := p.origin(token).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header
	}
	if c, _ := call(); c != 200 {
		t.Fatalf("first: %d", c)
	}
	clock.Advance(30 * time.Second)
	if c, _ := call(); c != 200 {
		t.Fatalf("second: %d", c)
	}
	code, h := call()
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "30" || h.Get("X-Berth-Budget") != "requests_per_minute" {
		t.Fatalf("third within the minute: %d Retry-After %q budget %q, want 429, 30, requests_per_minute", code, h.Get("Retry-After"), h.Get("X-Berth-Budget"))
	}
	clock.Advance(31 * time.Second) // the first call leaves the window
	if c, _ := call(); c != 200 {
		t.Fatalf("after the first left the window: %d", c)
	}
	if reached.Load() != 3 {
		t.Fatalf("the provider saw %d calls, want 3", reached.Load())
	}
}

func TestABudgetRefusalSpeaksAnthropicsErrorFormat(t *testing.T) {
	t.Parallel()
	srv := fakeProvider(t, func(*http.Request) string { return anthropicJSON })
	p, _ := usageProxy(t, "anthropic", srv, &egresspolicy.Allowance{Budget: egresspolicy.Budget{CostPerDay: 1}, CostLeft: 0}, egress.Options{})
	code, body := do(t, p.origin(token), "POST", "http://egress/providers/llm/v1/messages", `{"model":"m1"}`)
	var an struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if code != 403 || json.Unmarshal([]byte(body), &an) != nil || an.Type != "error" || an.Error.Type != "permission_error" || !strings.Contains(an.Error.Message, "cost_per_day (1)") {
		t.Fatalf("got %d %s, want 403 in Anthropic's error format naming cost_per_day", code, body)
	}
}

// Without a budget nothing is refused however much is spent: the control.
func TestWithoutABudgetNoCallIsRefused(t *testing.T) {
	t.Parallel()
	_, answer := countingProvider(t, 1_000_000, 1_000_000)
	srv := fakeProvider(t, answer)
	p, got := usageProxy(t, "openai", srv, nil, egress.Options{})
	for i := range 3 {
		if code, _ := do(t, p.origin(token), "POST", "http://egress/providers/llm/chat/completions", `{"model":"m1"}`); code != 200 {
			t.Fatalf("call %d: %d", i+1, code)
		}
	}
	if cs := got.wait(t, 3); cs[2].Seq != 3 || cs[2].Budget != "" {
		t.Fatalf("calls = %+v", cs)
	}
}

func refusedFor(ds []egresspolicy.Decision, reason string) bool {
	for _, d := range ds {
		if !d.Allowed && strings.Contains(d.Reason, reason) {
			return true
		}
	}
	return false
}
