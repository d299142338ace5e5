package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

const usageBase = `[providers]
primary = "openai"

[providers.openai]
api_key_env = "OPENAI_API_KEY"
model = "gpt-4o-mini"

[providers.openai.prices."gpt-4o-mini"]
input = 0.15
output = 0.6
cached = 0.075

[providers.openai.prices."gpt-4o"]
input = 2
output = 8

[agent_defaults.budget]
tokens_per_day = 1000000
requests_per_minute = 30

[[agents]]
id = "coder"

[agents.budget]
cost_per_day = 5
cost_per_run = 0.25

[agents.egress]
mode = "read-only"

[[agents]]
id = "writer"

[[connectors]]
id = "hook"
type = "webhook"
secret = "s"
`

func TestLoadReadsPricesBudgetsAndReadOnlyEgress(t *testing.T) {
	t.Parallel()
	c, err := config.Load(writeConfig(t, map[string]string{"berth.toml": usageBase}))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	prices := c.Providers.Entries["openai"].ModelPrices()
	want := map[string]egresspolicy.Price{"gpt-4o-mini": {Input: 0.15, Output: 0.6, Cached: 0.075}, "gpt-4o": {Input: 2, Output: 8}}
	if !reflect.DeepEqual(prices, want) {
		t.Fatalf("prices = %+v, want %+v", prices, want)
	}
	coder, _ := c.Agent("coder")
	if want := (egresspolicy.Budget{TokensPerDay: 1000000, CostPerDay: 5, CostPerRun: 0.25, RequestsPerMinute: 30}); coder.Budget != want || !coder.EgressReadOnly {
		t.Fatalf("coder: budget %+v read-only %v, want %+v and read-only", coder.Budget, coder.EgressReadOnly, want)
	}
	writer, _ := c.Agent("writer")
	if want := (egresspolicy.Budget{TokensPerDay: 1000000, RequestsPerMinute: 30}); writer.Budget != want || writer.EgressReadOnly {
		t.Fatalf("writer: budget %+v read-only %v, want the defaults' %+v and read-write", writer.Budget, writer.EgressReadOnly, want)
	}
}

func TestADropInRaisesOneBudgetKey(t *testing.T) {
	t.Parallel()
	c, err := config.Load(writeConfig(t, map[string]string{
		"berth.toml":             usageBase,
		"berth.d/50-budget.toml": "[[agents]]\nid = \"coder\"\n\n[agents.budget]\ncost_per_day = 20\n",
	}))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	coder, _ := c.Agent("coder")
	if coder.Budget.CostPerDay != 20 || coder.Budget.CostPerRun != 0.25 {
		t.Fatalf("budget %+v, want cost_per_day 20 and cost_per_run kept", coder.Budget)
	}
}

func TestLoadRefusesBadPricesBudgetsAndModes(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, add, want string }{
		{"a negative price", "[providers.openai.prices.m]\ninput = -1\n", "providers.openai.prices.m.input: must be a number of 0 or more, not -1"},
		{"a price that is not a number", "[providers.openai.prices.m]\noutput = \"cheap\"\n", "providers.openai.prices.m.output"},
		{"a price key no model has", "[providers.openai.prices.m]\nwhatever = 1\n", "unknown key"},
		{"a negative token budget", "[[agents]]\nid = \"x\"\n[agents.budget]\ntokens_per_day = -5\n", "agents[2].budget.tokens_per_day: must be 0 (no limit) or more, not -5"},
		{"an unknown budget key", "[[agents]]\nid = \"x\"\n[agents.budget]\ntokens_per_week = 5\n", "unknown key"},
		{"an unknown egress mode", "[[agents]]\nid = \"x\"\n[agents.egress]\nmode = \"write-only\"\n", `"write-only" is not one of read-only`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": usageBase + "\n" + tt.add}))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want an error with %q", err, tt.want)
			}
		})
	}
}
