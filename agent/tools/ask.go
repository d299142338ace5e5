package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// AskFunc asks a person, through the run's egress proxy, whether a tool
// call may run (agent/egress.ToolAsker); nil when the run has no proxy
// to ask through.
type AskFunc func(ctx context.Context, tool, command string) (egresspolicy.ToolAskAnswer, error)

// toolAsks are a set's [agents.tools] ask rules and the way to ask.
type toolAsks struct {
	rules []egresspolicy.ToolRule
	ask   AskFunc
}

// Asking is s, asking before every call one of rules matches (with ask;
// nil denies each such call: nobody can be asked).
func (s *Set) Asking(rules []egresspolicy.ToolRule, ask AskFunc) *Set {
	return &Set{tools: s.tools, asks: toolAsks{rules: rules, ask: ask}}
}

// Ask decides a call before it runs: "" and nil when no ask rule matches
// it; the decision's reason ("approved by berthctl:root") when a person
// allowed it; an error for the model, naming who denied it, when not.
func (s *Set) Ask(ctx context.Context, name string, args json.RawMessage) (string, error) {
	if !slices.ContainsFunc(s.tools, func(t Tool) bool { return t.Spec().Name == name }) {
		return "", nil // Call refuses it: nothing to ask about
	}
	command, ok := askedCommand(name, args)
	if !ok {
		return "", nil
	}
	rule, ok := egresspolicy.MatchTool(s.asks.rules, name, command)
	if !ok {
		return "", nil
	}
	if s.asks.ask == nil {
		return "", fmt.Errorf("not run: [agents.tools] ask rule %q asks a person first, and this run has no egress proxy to ask through", rule.Raw)
	}
	ans, err := s.asks.ask(ctx, name, command)
	if err != nil {
		return "", fmt.Errorf("not run: [agents.tools] ask rule %q asks a person first, and berth could not ask: %v", rule.Raw, err)
	}
	if !ans.Allow {
		return "", fmt.Errorf("not run: a person was asked first ([agents.tools] ask rule %q) and it was %s", rule.Raw, ans.Reason)
	}
	return ans.Reason, nil
}

// askedCommand is what a tool ask names of a call: the shell's command as
// the shell tool reads it; another tool's arguments as compact JSON. False
// for a shell call the shell tool would refuse anyway (bad arguments).
func askedCommand(name string, args json.RawMessage) (string, bool) {
	if name == egresspolicy.ShellTool {
		a, err := shellArgsOf(args)
		if err != nil {
			return "", false
		}
		return a.Command, true
	}
	var b bytes.Buffer
	if json.Compact(&b, args) != nil {
		return string(args), true
	}
	return b.String(), true
}
