package egresspolicy

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// A run's proxy has two channels (docs/adr/0026-agent-own-egress-channel.md):
// the tools' (the run token, which berth-agent's in-sandbox proxy adds to
// every tool request) and berth-agent's own (the agent token, which only
// berth-agent holds: web_search and berth.toml's MCP servers). A rule or a
// secret whose AgentTool is set applies to berth-agent's own channel only; one
// without applies to both.

// AgentRule is the allow rule berth-agent's own requests to u get, for
// what ("web_search", "MCP server tracker"): its exact host and port, CONNECT
// for https, methods for plain http.
func AgentRule(what string, u *url.URL, methods ...string) (Rule, error) {
	if u.Scheme != "http" && u.Scheme != "https" || u.Hostname() == "" {
		return Rule{}, fmt.Errorf("%s: %q is not an http(s) URL", what, u.Redacted())
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		var err error
		if port, err = strconv.Atoi(p); err != nil {
			return Rule{}, fmt.Errorf("%s: %q has no valid port", what, u.Redacted())
		}
	}
	if u.Scheme == "https" {
		methods = []string{"CONNECT"}
	}
	r, err := ParseRule(strings.Join(methods, ",") + " " + net.JoinHostPort(NormalHost(u.Hostname()), strconv.Itoa(port)))
	if err != nil {
		return Rule{}, fmt.Errorf("%s: %w", what, err)
	}
	r.Raw, r.AgentTool = what+": "+r.Raw, what
	return r, nil
}

// OnAgentChannel is j judging berth-agent's own requests: the rules and
// secrets of its own tools (AgentTool) apply too.
func (j *Judge) OnAgentChannel() *Judge {
	own := *j
	own.AgentChannel = true
	return &own
}

// onChannel says whether a rule or secret for agent tool what applies on j's channel.
func (j *Judge) onChannel(what string) bool {
	return what == "" || j.AgentChannel
}

// channelRules are the allow rules that judge a request on j's channel.
func (j *Judge) channelRules() []Rule {
	if j.AgentChannel {
		return j.Allow
	}
	var out []Rule
	for _, r := range j.Allow {
		if r.AgentTool == "" {
			out = append(out, r)
		}
	}
	return out
}

// agentOnly is why the tools' channel may not send method to host:port
// although berth-agent's own may, or "" when no rule of an agent's tool
// matches.
func (j *Judge) agentOnly(method, host string, port int) string {
	if j.AgentChannel {
		return ""
	}
	for _, r := range j.Allow {
		if r.AgentTool != "" && r.Matches(method, host, port) {
			return fmt.Sprintf("%s %s:%d is allowed for berth-agent's own %s only (rule %q), never for a tool's request: no [agents.egress] allow rule lets tools reach it", method, host, port, r.AgentTool, r.Raw)
		}
	}
	return ""
}
