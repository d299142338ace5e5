package runplan

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// agentToolRules are the allow rules of berth-agent's own requests
// (docs/adr/0026-agent-own-egress-channel.md): web_search's base URL and
// each berth.toml HTTP MCP server's URL, for the agent token only. The
// admin wrote those URLs; a tool's request never matches these rules.
func agentToolRules(c *compiled, a config.Agent) []isolation.EgressRule {
	var out []isolation.EgressRule
	add := func(what, raw string, methods ...string) {
		u, err := url.Parse(raw)
		if err == nil {
			var r isolation.EgressRule
			if r, err = egresspolicy.AgentRule(what, u, methods...); err == nil {
				out = append(out, r)
				return
			}
		}
		c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "agent %q: %s: %v", a.ID, what, err))
	}
	if ws := a.WebSearch; ws != nil {
		add("web_search", ws.BaseURL, "GET")
	}
	for _, m := range a.MCP {
		if m.URL != "" {
			// Streamable HTTP: POSTs, the GET of a stream, the DELETE that ends a session.
			add("MCP server "+m.Name, m.URL, "POST", "GET", "DELETE")
		}
	}
	return out
}

// agentSecretOwners names, by secret, the agent's own tool that secret is
// for (web_search's secret, an MCP server's headers_secret): such a secret
// is added to berth-agent's own requests only.
func agentSecretOwners(a config.Agent) map[string]string {
	owners := map[string]string{}
	own := func(secret, what string) {
		switch {
		case secret == "":
		case owners[secret] == "":
			owners[secret] = what
		default:
			owners[secret] += ", " + what
		}
	}
	if ws := a.WebSearch; ws != nil {
		own(ws.Secret, "web_search")
	}
	for _, m := range a.MCP {
		own(m.HeadersSecret, "MCP server "+m.Name)
	}
	return owners
}

// channelRules are the rules a secret's hosts must be reachable by: the
// agent's own rules for a secret of its own tools (owner set), the
// admin's [agents.egress] allow otherwise.
func channelRules(rules []isolation.EgressRule, owner string) []isolation.EgressRule {
	var out []isolation.EgressRule
	for _, r := range rules {
		if (r.AgentTool != "") == (owner != "") {
			out = append(out, r)
		}
	}
	return out
}

// agentChannelWhy says, for sandbox explain, which hosts and secrets are
// berth-agent's own.
func agentChannelWhy(rules []isolation.EgressRule, secrets []isolation.EgressSecret) string {
	var parts []string
	for _, r := range rules {
		if r.AgentTool != "" {
			parts = append(parts, fmt.Sprintf("%s:%d for %s only", r.Host, r.Port, r.AgentTool))
		}
	}
	for _, s := range secrets {
		if s.AgentTool != "" {
			parts = append(parts, fmt.Sprintf("secret %s for %s only", s.Name, s.AgentTool))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; berth-agent's own requests (its own token, which no tool holds): " + strings.Join(parts, ", ") +
		" — a tool's request to these hosts is refused unless an [agents.egress] allow rule lets tools reach them, and never gets these secrets"
}
