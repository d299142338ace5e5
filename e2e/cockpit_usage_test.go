package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The Cockpit page's Usage view (issue 27: "the Cockpit page charts it per
// agent per day"), in a real browser against real Cockpit, the real
// services and each run's real egress proxy, which reads the usage of the
// fake OpenAI server's answers (1 prompt and 1 completion token each).

// usageSuite runs agents "spender" and "quiet", both without a network of
// their own (their model calls go through their run's egress proxy), with
// the fake model priced at 100000 per million input tokens and 400000 per
// million output tokens: a call costs 0.1 + 0.4.
func usageSuite(t *testing.T, model *fakeOpenAI) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "fake"

[providers.fake]
kind = "openai"
base_url = %q
api_key_env = "E2E_FAKE_KEY"
model = "gpt-e2e"

[providers.fake.prices."gpt-e2e"]
input = 100000
output = 400000

[[agents]]
id = "spender"
max_iterations = 4

[[agents]]
id = "quiet"

[intake]
default_agent = "spender"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[bindings]]
connector = "hooks"
channel_id = "spender"
agent = "spender"

[scheduler]
default_timeout_seconds = 60
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, model.srv.URL+"/v1", secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	s := launchShort(t, sink, cfg, []string{"E2E_FAKE_KEY=" + fakeKey}, fakeKey)
	stopImaged(t, s)
	return s
}

func jsUsageAgent(agent string) string {
	return `document.querySelector('#usage-agents [data-usage-agent=` + strconv.Quote(agent) + `]')`
}

func TestCockpitUsageChartsTokensAndCostPerAgentPerDayAfterRunsThatCalledAModel(t *testing.T) {
	model := newFakeOpenAI(t)
	s := usageSuite(t, model)
	c := openCockpit(t, s, "")
	c.open("/usage")

	// The control: before any model call the view says there is nothing,
	// and draws no agent.
	c.waitFor(live, `document.getElementById("view-usage").dataset.loaded === "true"`)
	c.waitFor(live, `document.getElementById("usage-empty").hidden === false && document.querySelectorAll("#usage-agents [data-usage-agent]").length === 0`)

	for _, msg := range []string{"first", "second"} {
		id := s.mustPost(t, "spender", msg)
		if reply := s.sink.wait(t, 60*time.Second, id)[id]; reply["state"] != "succeeded" {
			t.Fatalf("%q: state %v, error %v", msg, reply["state"], reply["error"])
		}
	}

	// The runs' ends reach the page (RunFinished), without reload: two
	// calls of 2 tokens each, 0.5 each.
	row := jsUsageAgent("spender")
	c.waitFor(live, row+`?.dataset.tokens === "4" && `+row+`?.dataset.calls === "2"`)
	c.noReload()
	if got := evalString(c, row+`.dataset.cost`); got != "1" {
		t.Errorf("spender's cost shows as %q, want 1 (two calls at 0.1 + 0.4)", got)
	}
	today := time.Now().UTC().Format(time.DateOnly)
	bar := row + `.querySelector('svg g[data-day=` + strconv.Quote(today) + `]')`
	if got := evalString(c, bar+`?.dataset.tokens + " " + `+bar+`?.dataset.cost`); got != "4 1" {
		t.Errorf("today's bars of spender carry %q, want tokens 4 and cost 1", got)
	}
	if got := evalString(c, `String(`+bar+`.querySelector("rect.berth-usage-tokens").getAttribute("height") > 0)`); got != "true" {
		t.Error("today's tokens bar of spender is not drawn")
	}
	// The other 29 days of the period are there, empty.
	if got := evalString(c, `String(`+row+`.querySelectorAll('svg g[data-day][data-tokens="0"]').length)`); got != "29" {
		t.Errorf("%s days without usage in the 30-day chart, want 29", got)
	}
	if got := evalString(c, row+`.querySelector('[data-total="tokens"]').textContent + " / " + `+row+`.querySelector('[data-total="calls"]').textContent`); got != "4 / 2" {
		t.Errorf("spender's totals show as %q, want 4 tokens / 2 calls", got)
	}
	if got := evalString(c, `String(`+jsUsageAgent("quiet")+` === null)`); got != "true" {
		t.Error("the quiet agent, which called no model, has a chart")
	}
	c.waitFor(live, `document.getElementById("usage-empty").hidden === true`)
	c.screenshot("cockpit-usage.png")
}
