package tools

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// askRecorder answers every ask with answer and keeps what it was asked.
type askRecorder struct {
	asked  []string
	answer egresspolicy.ToolAskAnswer
	err    error
}

func (a *askRecorder) ask(_ context.Context, tool, command string) (egresspolicy.ToolAskAnswer, error) {
	a.asked = append(a.asked, tool+": "+command)
	return a.answer, a.err
}

func askingSet(t *testing.T, ask AskFunc, raw ...string) *Set {
	t.Helper()
	var rules []egresspolicy.ToolRule
	for _, s := range raw {
		r, err := egresspolicy.ParseToolRule(s)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	return Filter(Builtin(Env{Workspace: t.TempDir()}), nil, nil).Asking(rules, ask)
}

func TestACallAnAskRuleMatchesWaitsForTheAnswer(t *testing.T) {
	t.Parallel()
	shell := func(command string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"command": command})
		return b
	}
	for _, tc := range []struct {
		name      string
		answer    egresspolicy.ToolAskAnswer
		askErr    error
		call      string
		args      json.RawMessage
		wantAsked []string
		wantOK    string
		wantErr   string
	}{
		{name: "Allowed_it_runs_and_names_the_approver", answer: egresspolicy.ToolAskAnswer{Allow: true, Reason: "approved by berthctl:root"},
			call: "shell", args: shell("git push origin main"), wantAsked: []string{"shell: git push origin main"}, wantOK: "approved by berthctl:root"},
		{name: "Denied_the_model_reads_who_denied_it", answer: egresspolicy.ToolAskAnswer{Reason: "denied by slack:U1"},
			call: "shell", args: shell("cd x && git push"), wantAsked: []string{"shell: cd x && git push"}, wantErr: `it was denied by slack:U1`},
		{name: "A_command_no_rule_matches_is_not_asked", call: "shell", args: shell("git status"), wantAsked: nil},
		{name: "A_bare_rule_asks_with_the_arguments", answer: egresspolicy.ToolAskAnswer{Reason: "not approved within 10m0s"},
			call: "write_file", args: json.RawMessage(`{ "path": "a",  "content": "b" }`), wantAsked: []string{`write_file: {"path":"a","content":"b"}`}, wantErr: "not approved within 10m0s"},
		// Go's decoder takes a duplicated key's last value, and so does the
		// shell tool: the ask names the command that would run.
		{name: "A_duplicated_key_asks_about_the_command_the_shell_would_run", answer: egresspolicy.ToolAskAnswer{Reason: "denied by slack:U1"},
			call: "shell", args: json.RawMessage(`{"command":"git status","command":"git push origin"}`), wantAsked: []string{"shell: git push origin"}, wantErr: "denied"},
		{name: "Escaped_letters_are_decoded_before_matching", answer: egresspolicy.ToolAskAnswer{Reason: "denied by slack:U1"},
			call: "shell", args: json.RawMessage(`{"command":"\u0067it push"}`), wantAsked: []string{"shell: git push"}, wantErr: "denied"},
		{name: "When_berth_cannot_ask_it_does_not_run", askErr: errors.New("connection refused"),
			call: "shell", args: shell("git push"), wantAsked: []string{"shell: git push"}, wantErr: "berth could not ask: connection refused"},
		{name: "Bad_shell_arguments_are_the_tools_own_error", call: "shell", args: json.RawMessage(`{"cmd":"git push"}`), wantAsked: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &askRecorder{answer: tc.answer, err: tc.askErr}
			set := askingSet(t, rec.ask, "shell: git push *", "write_file")
			got, err := set.Ask(context.Background(), tc.call, tc.args)
			if !slices.Equal(rec.asked, tc.wantAsked) {
				t.Fatalf("asked %q, want %q", rec.asked, tc.wantAsked)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "not run: ") {
					t.Fatalf("Ask = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.wantOK {
				t.Fatalf("Ask = %q, %v; want %q", got, err, tc.wantOK)
			}
		})
	}
}

func TestWithoutAProxyEveryAskedCallIsDenied(t *testing.T) {
	t.Parallel()
	_, err := askingSet(t, nil, "shell").Ask(context.Background(), "shell", json.RawMessage(`{"command":"ls"}`))
	if err == nil || !strings.Contains(err.Error(), "no egress proxy to ask through") {
		t.Fatalf("Ask = %v, want denied: nobody can be asked", err)
	}
}

func TestASkillsRestrictedSetStillAsks(t *testing.T) {
	t.Parallel()
	rec := &askRecorder{answer: egresspolicy.ToolAskAnswer{Reason: "denied by x"}}
	set := askingSet(t, rec.ask, "shell").Restrict([]string{"shell"})
	if _, err := set.Ask(context.Background(), "shell", json.RawMessage(`{"command":"ls"}`)); err == nil || len(rec.asked) != 1 {
		t.Fatalf("a restricted set ran unasked: %v, asked %q", err, rec.asked)
	}
}

// [agents.tools] ask is checked against agentproto.BuiltinTools: the list
// must be these tools' names.
func TestTheBuiltinToolNamesAreTheOnesConfigKnows(t *testing.T) {
	t.Parallel()
	var names []string
	for _, tool := range append(Builtin(Env{}), WebSearch(Env{}, &agentproto.WebSearch{Kind: "searxng", BaseURL: "http://search.example"})...) {
		names = append(names, tool.Spec().Name)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(agentproto.BuiltinTools))
	if !slices.Equal(names, want) {
		t.Fatalf("tools %q, agentproto.BuiltinTools %q", names, want)
	}
}
