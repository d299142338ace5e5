package busapi

import (
	"context"
	"strings"
)

// A git question travels as ExplainEgress with the method "git fetch" or
// "git push REF" and the remote as the URL, so the bus interface keeps one
// explain call and the scheduler answers it with egresspolicy's ExplainGit.
const gitMethodPrefix = "git "

// GitMethod is ExplainEgress's method for a git fetch, or a push of ref.
func GitMethod(op, ref string) string {
	return strings.TrimSpace(gitMethodPrefix + op + " " + ref)
}

// ParseGitMethod reads what GitMethod wrote; ok is false for any other
// method.
func ParseGitMethod(method string) (op, ref string, ok bool) {
	rest, ok := strings.CutPrefix(method, gitMethodPrefix)
	if !ok {
		return "", "", false
	}
	op, ref, _ = strings.Cut(strings.TrimSpace(rest), " ")
	return op, strings.TrimSpace(ref), true
}

// ExplainGit says whether the agent's egress proxy would let a git fetch
// of remote (op "fetch"), or a push of ref to it (op "push"), pass, and why.
func (s Scheduler) ExplainGit(ctx context.Context, agent, op, remote, ref string) (EgressVerdict, error) {
	return s.ExplainEgress(ctx, agent, GitMethod(op, ref), remote)
}
