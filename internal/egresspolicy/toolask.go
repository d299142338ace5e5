package egresspolicy

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Tool asks (issue 26): [agents.tools] ask = ["shell", "shell: git push *"]
// makes berth-agent pause before a tool call a rule matches and ask its
// run's berth-egress, on the agent's own channel (ADR 26), at ToolAskPath.
// The proxy checks the call against its own copy of the rules, holds it as
// it holds an egress ask and answers; the tool runs only if a person allowed
// it. berth-agent decides when to ask, the proxy what the answer is: a tool
// in the sandbox holds neither the agent token nor a way to answer.

// ToolAskPath is where berth-agent asks its run's proxy about a tool call
// (a POST of a ToolAskRequest, answered with a ToolAskAnswer).
const ToolAskPath = "/berth/tool-ask"

// MaxToolAskCommand is the longest command a person is asked about: a
// longer one is denied unasked (nobody reads 4 KiB in a chat message, and
// what is not read is not approved).
const MaxToolAskCommand = 4096

// ToolAskRequest is berth-agent's question to its proxy: the tool and its
// command line (shell's command; another tool's arguments as JSON).
type ToolAskRequest struct {
	Tool    string `json:"tool"`
	Command string `json:"command"`
}

// ToolAskAnswer is the proxy's answer: allowed or not, who decided and the
// reason as the decision reads ("denied by berthctl:root").
type ToolAskAnswer struct {
	Allow  bool   `json:"allow"`
	By     string `json:"by,omitempty"`
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason"`
}

// ShellTool is the one tool whose calls a pattern matches: its command line.
const ShellTool = "shell"

// ToolRule is one [agents.tools] ask entry: a bare tool name asks before
// every call of that tool; "shell: PATTERN" before every shell command the
// pattern matches (Matches).
type ToolRule struct {
	// Raw is the rule as written in the config.
	Raw  string `json:"raw"`
	Tool string `json:"tool"`
	// Pattern is the glob, normalised as commands are ("": every call).
	Pattern string `json:"pattern,omitempty"`
}

// AskRule is how an Ask names r: apart from every egress ask rule (a host
// may be called "shell"), so a standing answer or a conversation's grant
// of one never answers the other.
func (r ToolRule) AskRule() string { return "[agents.tools] " + r.Raw }

// ParseToolRule parses one [agents.tools] ask entry.
func ParseToolRule(s string) (ToolRule, error) {
	tool, pattern, hasPattern := strings.Cut(s, ":")
	tool = strings.TrimSpace(tool)
	if tool == "" {
		return ToolRule{}, errors.New(`want a tool name, optionally with a shell pattern: "shell" or "shell: git push *"`)
	}
	for _, c := range tool {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return ToolRule{}, fmt.Errorf("%q is not a tool name (lower-case letters, digits and _)", tool)
		}
	}
	r := ToolRule{Raw: s, Tool: tool}
	if !hasPattern {
		return r, nil
	}
	if tool != ShellTool {
		return ToolRule{}, fmt.Errorf("a pattern matches shell commands only; write %q to ask before every call of %s", tool, tool)
	}
	r.Pattern = strings.Join(words(normalCommand(pattern)), " ")
	if r.Pattern == "" {
		return ToolRule{}, errors.New(`the pattern is empty; write "shell" to ask before every shell command`)
	}
	if strings.Trim(r.Pattern, "* ") == "" {
		return ToolRule{}, errors.New(`the pattern matches every command; write "shell" to ask before every shell command`)
	}
	return r, nil
}

// MatchTool is the first of rules that asks before a call of tool with
// command.
func MatchTool(rules []ToolRule, tool, command string) (ToolRule, bool) {
	for _, r := range rules {
		if r.Matches(tool, command) {
			return r, true
		}
	}
	return ToolRule{}, false
}

// Matches says whether r asks before tool runs command. A pattern is a
// glob (* is any run of characters, everything else itself; a trailing
// " *" also matches nothing) that must match a whole command: the command
// line, or one of the commands in it (split at ; & | newlines, parentheses,
// braces and backquotes), from any of its words on, with quotes and
// backslashes removed, white space collapsed and a path before the first
// word dropped. So "git push *" matches "  git  push", "cd x && git push",
// "FOO=1 /usr/bin/git push origin", "sh -c 'git push'" and "g'i't push",
// and "echo git push" too: it asks more rather than less. It cannot see
// what a command runs without naming it: a script, an alias, a variable
// ("$G push"), or options before the subcommand ("git -C dir push"). A
// command over MaxToolAskCommand bytes matches every pattern of its tool.
func (r ToolRule) Matches(tool, command string) bool {
	if tool != r.Tool {
		return false
	}
	if r.Pattern == "" {
		return true
	}
	if len(command) > MaxToolAskCommand {
		return true
	}
	for _, candidate := range commandForms(command) {
		if globMatch(r.Pattern, candidate) || (strings.HasSuffix(r.Pattern, " *") && globMatch(r.Pattern[:len(r.Pattern)-2], candidate)) {
			return true
		}
	}
	return false
}

// commandForms are the strings a pattern may match of command: the whole
// line and each command in it, each from every one of its words on.
func commandForms(command string) []string {
	command = strings.ReplaceAll(command, "\\\n", "")
	var forms []string
	addSuffixes := func(line string) {
		ws := words(normalCommand(line))
		for i := range ws {
			rest := ws[i:]
			forms = append(forms, strings.Join(rest, " "))
			if strings.Contains(rest[0], "/") {
				forms = append(forms, strings.Join(append([]string{path.Base(rest[0])}, rest[1:]...), " "))
			}
		}
	}
	addSuffixes(command)
	segments := strings.FieldsFunc(command, func(c rune) bool { return strings.ContainsRune(";&|\n(){}`", c) })
	if len(segments) > 1 {
		for _, seg := range segments {
			addSuffixes(seg)
		}
	}
	return forms
}

// normalCommand drops the shell's quoting ($'…', '…', "…", \) and turns
// every white space into a plain space.
func normalCommand(s string) string {
	s = strings.NewReplacer(`$'`, "", `$"`, "", `'`, "", `"`, "", `\`, "").Replace(s)
	return strings.Map(func(c rune) rune {
		if unicode.IsSpace(c) {
			return ' '
		}
		return c
	}, s)
}

func words(s string) []string { return strings.Fields(s) }

// globMatch says whether pattern, where * is any run of characters, matches
// all of s.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// ShowCommand is a command line as a person may safely read it: as it is
// when it holds only printable characters and plain spaces, else quoted
// in Go's ASCII escapes (a newline, a terminal escape, a right-to-left
// override, a zero-width or a no-break space each show as what they are).
func ShowCommand(s string) string {
	if !utf8.ValidString(s) {
		return strconv.QuoteToASCII(s)
	}
	for _, c := range s {
		if c != ' ' && (!strconv.IsGraphic(c) || unicode.IsSpace(c)) {
			return strconv.QuoteToASCII(s)
		}
	}
	return s
}
