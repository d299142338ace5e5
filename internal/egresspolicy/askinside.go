package egresspolicy

import (
	"net/http"
	"slices"
)

// Asks inside tunnels (issue 26, docs/adr/0032-approvals-in-the-chat.md).
// An ask rule with methods ("POST api.stripe.com") cannot match an https
// request: its CONNECT carries no method of the request inside. Where the
// proxy can read the tunnel — the run's CA covers the rule's host
// (InsideAskHosts) — it opens such a tunnel without asking and judges each
// request inside with its own method: one an inside ask rule matches is
// held for a person; any other the allow rules do not allow is refused.
// A secret of the host is added only to what is allowed, so an approved
// POST is also the one that carries the key.

// InsideAskRules are the ask rules judged inside tunnels: those with
// methods, none of them CONNECT, for a host that is not "*".
func InsideAskRules(rules []Rule) []Rule {
	var out []Rule
	for _, r := range rules {
		if len(r.Methods) > 0 && !slices.Contains(r.Methods, http.MethodConnect) && r.Host != "*" && r.Host != "" {
			out = append(out, r)
		}
	}
	return out
}

// InsideAskHosts are the hosts the run's CA must cover for its inside ask
// rules (a "*.example.com" rule: example.com and every name below it).
func InsideAskHosts(rules []Rule) []string { return ReadOnlyCAHosts(InsideAskRules(rules)) }

// AsksInside reports whether an inside ask rule names host:port: a tunnel
// there no rule allows is opened and read, not refused.
func (j *Judge) AsksInside(host string, port int) bool {
	for _, r := range InsideAskRules(j.Ask) {
		if r.Matches(r.Methods[0], host, port) {
			return true
		}
	}
	return false
}

// InsideAsk judges method to host:port inside a tunnel AsksInside opened:
// the inside ask rule that matches it, or why it is refused.
func (j *Judge) InsideAsk(method, host string, port int) (Rule, *Refusal) {
	if r, ok := MatchRule(InsideAskRules(j.Ask), method, host, port); ok {
		return r, nil
	}
	return Rule{}, refused(http.StatusForbidden, "%s", NoRule(method, host, port))
}
