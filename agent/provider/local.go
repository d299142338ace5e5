package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Local is the offline, deterministic provider (kind "local"). It never
// calls a model; it reads the last user message:
//
//   - "/sh COMMAND" requests one shell tool call with COMMAND. After the
//     result it replies "$ COMMAND\n" + stdout + "\n[stderr]\n" + stderr +
//     "\n[exit code N]" (stdout and stderr verbatim, as the tool returned them).
//     When the shell tool is not on offer it replies that it is denied.
//   - "/tool NAME ARGS" requests one call of tool NAME with ARGS passed on
//     as the raw argument text (so tests can send bad arguments). After the
//     result it replies "[NAME]\n" + output, or "[NAME error]\n" + error.
//   - Any other text gets "NAME: you said: TEXT", where NAME is the first
//     line of the system prompt (SOUL.md) without leading '#' and spaces.
type Local struct{}

// ShellCommandPrefix starts a local-provider message that runs a shell command.
const ShellCommandPrefix = "/sh "

// ToolCommandPrefix starts a local-provider message that calls any tool.
const ToolCommandPrefix = "/tool "

// Complete implements Provider.
func (Local) Complete(_ context.Context, conv Conversation, tools []Tool) (Turn, Usage, error) {
	msgs := conv.Messages
	if len(msgs) == 0 {
		return Turn{}, Usage{}, fmt.Errorf("local provider: empty conversation")
	}
	if msgs[len(msgs)-1].Role == RoleTool {
		return Turn{Text: describeResults(msgs)}, Usage{}, nil
	}
	last := msgs[len(msgs)-1]
	callID := fmt.Sprintf("local-%d", countRole(msgs, RoleAssistant)+1)
	switch {
	case strings.HasPrefix(last.Text, ShellCommandPrefix):
		command := strings.TrimPrefix(last.Text, ShellCommandPrefix)
		if !slices.ContainsFunc(tools, func(t Tool) bool { return t.Name == "shell" }) {
			return Turn{Text: fmt.Sprintf("cannot run %q: the shell tool is denied for this agent (tools allow/deny)", command)}, Usage{}, nil
		}
		args, _ := json.Marshal(map[string]string{"command": command})
		return Turn{ToolCalls: []ToolCall{{ID: callID, Name: "shell", Args: args}}}, Usage{}, nil
	case strings.HasPrefix(last.Text, ToolCommandPrefix):
		name, args, _ := strings.Cut(strings.TrimPrefix(last.Text, ToolCommandPrefix), " ")
		return Turn{ToolCalls: []ToolCall{{ID: callID, Name: name, Args: json.RawMessage(args)}}}, Usage{}, nil
	default:
		return Turn{Text: fmt.Sprintf("%s: you said: %s", soulName(conv.System), last.Text)}, Usage{}, nil
	}
}

// describeResults renders the tool results that follow the last assistant turn.
func describeResults(msgs []Message) string {
	start := len(msgs)
	for start > 0 && msgs[start-1].Role == RoleTool {
		start--
	}
	var calls []ToolCall
	if start > 0 {
		calls = msgs[start-1].ToolCalls
	}
	parts := make([]string, 0, len(msgs)-start)
	for _, res := range msgs[start:] {
		i := slices.IndexFunc(calls, func(c ToolCall) bool { return c.ID == res.ToolCallID })
		var call ToolCall
		if i >= 0 {
			call = calls[i]
		}
		parts = append(parts, describeResult(call, res))
	}
	return strings.Join(parts, "\n")
}

func describeResult(call ToolCall, res Message) string {
	if res.ToolName != "shell" {
		if res.IsError {
			return fmt.Sprintf("[%s error]\n%s", res.ToolName, res.Text)
		}
		return fmt.Sprintf("[%s]\n%s", res.ToolName, res.Text)
	}
	var args struct {
		Command string `json:"command"`
	}
	_ = json.Unmarshal(call.Args, &args)
	if res.IsError {
		return fmt.Sprintf("$ %s\n[shell error]\n%s", args.Command, res.Text)
	}
	var out struct {
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(res.Text), &out); err != nil {
		return fmt.Sprintf("$ %s\n[unreadable shell result]\n%s", args.Command, res.Text)
	}
	return fmt.Sprintf("$ %s\n%s\n[stderr]\n%s\n[exit code %d]", args.Command, out.Stdout, out.Stderr, out.ExitCode)
}

func countRole(msgs []Message, role Role) int {
	n := 0
	for _, m := range msgs {
		if m.Role == role {
			n++
		}
	}
	return n
}

// soulName is the first non-empty line of the system prompt, without heading marks.
func soulName(system string) string {
	for line := range strings.SplitSeq(system, "\n") {
		if name := strings.TrimSpace(strings.TrimLeft(line, "# \t")); name != "" {
			return name
		}
	}
	return "agent"
}
