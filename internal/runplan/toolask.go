package runplan

import (
	"fmt"
	"strings"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// AgentTools is the tool filter and the [agents.tools] ask rules a run's
// request carries to berth-agent; the run's proxy gets the same rules in
// its plan (EgressPlan.ToolAsk) and judges each ask by its own copy.
func AgentTools(a config.Agent) agentproto.Tools {
	return agentproto.Tools{Allow: a.Tools.Allow, Deny: a.Tools.Deny, Ask: a.Tools.Ask}
}

// toolAskRules are the agent's [agents.tools] ask rules, parsed for its
// proxy. Any of them gives a run its proxy: berth-agent asks there.
func toolAskRules(c *compiled, a config.Agent) []egresspolicy.ToolRule {
	var out []egresspolicy.ToolRule
	for _, s := range a.Tools.Ask {
		r, err := egresspolicy.ParseToolRule(s)
		if err != nil {
			c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "agent %q: tools.ask: %v", a.ID, err))
			continue
		}
		out = append(out, r)
	}
	return out
}

// toolAskWhy says, for sandbox explain, what the agent's tool asks do: a
// run with a proxy asks through it; one without (a direct network,
// unrestricted) has nobody to ask, so every call they match is denied.
func toolAskWhy(a config.Agent, e *isolation.EgressPlan) string {
	if len(a.Tools.Ask) == 0 {
		return ""
	}
	rules := strings.Join(a.Tools.Ask, ", ")
	if e == nil {
		return fmt.Sprintf("; [agents.tools] ask: %s — the run has no egress proxy to ask through, so every call they match is denied", rules)
	}
	return fmt.Sprintf("; [agents.tools] ask: %s (berth-agent asks the proxy before a call they match; it runs once a person allows it in the conversation or with berthctl approvals, and is denied after %s)", rules, e.ApprovalTimeout)
}
