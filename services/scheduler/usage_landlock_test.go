package scheduler

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// usageModel is an OpenAI-compatible server that answers with the key
// only, each answer using 90 prompt and 10 completion tokens.
func usageModel(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+egressTestKey {
			http.Error(w, `{"error":{"message":"missing or wrong key"}}`, http.StatusUnauthorized)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[{"message":{"content":"answer"}}],"usage":{"prompt_tokens":90,"completion_tokens":10,"total_tokens":100}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A landlock run's real berth-egress counts each provider call into the
// run's record and the agent's day, refuses the call past tokens_per_day
// in OpenAI's error format (the run's reply says the budget stopped it),
// still refuses it after a restart, and lets it through once an admin
// raises the budget live. The key is in none of it.
func TestABudgetIsEnforcedAtTheProxyOfARealRunAndSurvivesARestart(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	agentBin, proxyBin := egressBinaries(t)
	model := usageModel(t)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	pr := cfg.Providers.Entries["openai"]
	pr.Prices = config.PricesOf(map[string]egresspolicy.Price{"gpt-test": {Input: 2, Output: 10}})
	cfg.Providers.Entries["openai"] = pr
	tokens := 150
	cfg.Agents[0].Budget = config.BudgetSettings{TokensPerDay: &tokens}
	dir := sharedStateDir(t)
	open := func() *Service {
		s, err := New(cfg, dir, Options{
			Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
			Getenv: func(k string) string {
				if k == "OPENAI_API_KEY" {
					return egressTestKey
				}
				return ""
			},
			Logger: quietLog,
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	stop := start(t, s)
	var ids []string
	run := func(s *Service) (Run, egressReport) {
		t.Helper()
		id := submit(t, s, fmt.Sprintf("m%d", len(ids)+1), "alpha")
		ids = append(ids, id)
		r := waitState(t, s, id, StateSucceeded)
		var rep egressReport
		// The agent's reply is its report; a budget's notice may follow it.
		if err := json.NewDecoder(strings.NewReader(r.Reply)).Decode(&rep); err != nil {
			t.Fatalf("reply %q: %v", r.Reply, err)
		}
		return r, rep
	}
	for range 2 { // 150 left, then 50: each call is let through
		r, rep := run(s)
		if rep.ProviderStatus != 200 || r.Usage == nil || r.Usage.Calls != 1 || r.Usage.Input != 90 || r.Usage.Output != 10 {
			t.Fatalf("run %s: provider %d %q, usage %+v", r.ID, rep.ProviderStatus, rep.ProviderBody, r.Usage)
		}
		if want := (90*2.0 + 10*10.0) / 1e6; r.Usage.Cost < want*0.999 || r.Usage.Cost > want*1.001 || len(r.Usage.Models) != 1 || r.Usage.Models[0].Model != "gpt-test" {
			t.Fatalf("run %s: cost %v per model %+v, want %v for gpt-test", r.ID, r.Usage.Cost, r.Usage.Models, want)
		}
	}
	r, rep := run(s)
	if rep.ProviderStatus != http.StatusForbidden || !strings.Contains(rep.ProviderBody, `"code":"berth_budget_tokens_per_day"`) {
		t.Fatalf("the call past the budget: %d %q, want 403 in OpenAI's error format", rep.ProviderStatus, rep.ProviderBody)
	}
	if r.Usage == nil || r.Usage.Budget != "tokens_per_day" || !strings.Contains(r.Reply, "(berth: a model call was stopped: the agent's budget tokens_per_day (150) is used up") {
		t.Fatalf("the stopped run's record: usage %+v reply %q", r.Usage, r.Reply)
	}
	if !refusedEgress(r.Egress, "budget tokens_per_day") {
		t.Fatalf("no egress decision names the budget: %+v", r.Egress)
	}
	days, err := s.UsageDays("alpha", r.CreatedAt)
	if err != nil || len(days) != 1 || days[0].Usage.Calls != 2 || days[0].Usage.Refused != 1 || days[0].Usage.Input != 180 {
		t.Fatalf("the agent's day: %+v, %v", days, err)
	}
	stop()
	s.Close()

	s = open()
	start(t, s)
	if _, rep := run(s); rep.ProviderStatus != http.StatusForbidden {
		t.Fatalf("after a restart the call got %d, want the budget's 403", rep.ProviderStatus)
	}
	if err := s.SetBudget("alpha", "tokens_per_day", "10000"); err != nil {
		t.Fatal(err)
	}
	if _, rep := run(s); rep.ProviderStatus != 200 {
		t.Fatalf("after the raise the call got %d %q", rep.ProviderStatus, rep.ProviderBody)
	}
	for _, id := range ids {
		r, err := s.GetRun(id)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(r)
		if strings.Contains(string(raw), egressTestKey) {
			t.Fatalf("a run record carries the provider key: %s", raw)
		}
	}
}

func refusedEgress(ds []isolation.EgressDecision, reason string) bool {
	for _, d := range ds {
		if !d.Allowed && strings.Contains(d.Reason, reason) {
			return true
		}
	}
	return false
}
