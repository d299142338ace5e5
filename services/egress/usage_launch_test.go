package egress_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// The berth-egress process reports each call on its stdout, takes a newer
// allowance on its stdin while it runs, and the run's record sums the
// calls; no key is in any of it.
func TestTheLaunchedProxyReportsCallsAndTakesAllowancesOnStdin(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	reached, answer := countingProvider(t, 70, 30)
	srv := fakeProvider(t, answer)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", "run-u", isolation.EgressSocketName)
	lim := egresspolicy.Budget{TokensPerDay: 150}
	pol := egress.Policy{RunID: "run-u", Agent: "ops", Token: token, Allowance: &egresspolicy.Allowance{Budget: lim, TokensLeft: 150},
		Providers: []egress.Provider{{Name: "llm", Kind: "openai", BaseURL: srv.URL + "/v1", Model: "m1", Key: openKey,
			Prices: map[string]egresspolicy.Price{"m1": {Input: 1, Output: 2}}}}}
	got := newCalls()
	p, err := egress.Launch(context.Background(), pol, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, User: nobody, Client: nobody, Socket: socket, OnCall: got.add})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	call := func() int {
		code, _ := rawRequest(t, socket, "POST", "/providers/llm/chat/completions", `{"model":"m1"}`, nil)
		return code
	}
	for i, want := range []int{200, 200, 403} {
		if code := call(); code != want {
			t.Fatalf("call %d: %d, want %d", i+1, code, want)
		}
		got.wait(t, i+1)
	}
	if err := p.SetAllowance(egresspolicy.Allowance{Budget: egresspolicy.Budget{TokensPerDay: 1000}, TokensLeft: 1000 - 200, AsOf: 3}); err != nil {
		t.Fatal(err)
	}
	// The allowance travels on a pipe the proxy reads on its own: the next
	// call may come before it is read, so the test calls until one passes
	// (each refused call is reported, which is the event waited on).
	for n := 4; call() != 200; n++ {
		got.wait(t, n)
		if n > 50 {
			t.Fatal("the raised allowance never reached the proxy")
		}
	}
	rec := p.Stop()
	u := rec.Usage
	if u.Calls != 3 || u.Input != 210 || u.Output != 90 || u.Budget != egresspolicy.BudgetTokensPerDay || u.Refused < 1 || reached.Load() != 3 {
		t.Fatalf("usage = %+v (provider reached %d times)", u, reached.Load())
	}
	if len(u.Models) != 1 || u.Models[0].Model != "m1" || math.Abs(u.Cost-(210*1+90*2)/1e6) > 1e-12 {
		t.Fatalf("per model = %+v, cost %v", u.Models, u.Cost)
	}
	for _, c := range got.all() {
		if strings.Contains(c.Provider+c.Model+c.BudgetReason, openKey) {
			t.Fatalf("a call carries the key: %+v", c)
		}
	}
}
