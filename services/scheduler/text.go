package scheduler

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Bounds of what a run record keeps. The reply is always kept whole.
const (
	maxStderrTail     = 8 << 10   // the end of the agent's stderr
	maxToolOutput     = 16 << 10  // one tool call's output
	maxToolOutputsRun = 256 << 10 // all tool outputs of one run
)

// cleanText makes s fit for D-Bus, whose strings must be valid UTF-8
// without NUL: invalid bytes and NUL characters each become U+FFFD. It is
// applied where a text enters the run record (Submit, a run's outcome), so
// every reply, error, tool output and message field the scheduler hands on
// can be sent.
func cleanText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// cutUTF8 is the longest prefix of s of at most n bytes that ends on a
// character boundary.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// tailUTF8 keeps the last n bytes of s, starting on a character boundary.
func tailUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// storedToolCall is a tool call as the run record keeps it: the output
// bounded, and when it was cut, the size it had.
type storedToolCall struct {
	Name        string          `json:"name"`
	Args        json.RawMessage `json:"args,omitempty"`
	Output      string          `json:"output,omitempty"`
	Error       string          `json:"error,omitempty"`
	OutputCut   bool            `json:"output_cut,omitempty"`
	OutputBytes int             `json:"output_bytes,omitempty"` // the original size, when cut
	ArgsCut     bool            `json:"args_cut,omitempty"`     // args became a JSON string of their start
	ArgsBytes   int             `json:"args_bytes,omitempty"`
	// Approval names who allowed a call an [agents.tools] ask rule matched.
	Approval string `json:"approval,omitempty"`
}

// boundToolCalls encodes calls for the run record: each output made valid
// (cleanText) and cut to maxToolOutput, and all of them together to
// maxToolOutputsRun (later calls get what is left).
func boundToolCalls(calls []agentproto.ToolCall) (json.RawMessage, error) {
	if len(calls) == 0 {
		return nil, nil
	}
	budget := maxToolOutputsRun
	out := make([]storedToolCall, 0, len(calls))
	for _, c := range calls {
		output := cleanText(c.Output)
		sc := storedToolCall{Name: cleanText(c.Name), Args: c.Args, Error: cleanText(c.Error), Approval: cleanText(c.Approval)}
		limit := min(maxToolOutput, budget)
		sc.Output = cutUTF8(output, limit)
		if len(sc.Output) < len(output) {
			sc.OutputCut, sc.OutputBytes = true, len(c.Output)
		}
		budget -= len(sc.Output)
		if len(sc.Args) > 0 && !json.Valid(sc.Args) {
			sc.Args = nil
		}
		if len(sc.Args) > maxToolOutput {
			start, err := json.Marshal(cutUTF8(cleanText(string(sc.Args)), maxToolOutput))
			if err != nil {
				return nil, fmt.Errorf("cannot encode tool call args: %w", err)
			}
			sc.Args, sc.ArgsCut, sc.ArgsBytes = start, true, len(c.Args)
		}
		out = append(out, sc)
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("cannot encode tool calls: %w", err)
	}
	// Marshal escapes control characters; what is left to clean is invalid
	// UTF-8 inside args.
	return json.RawMessage(cleanText(string(data))), nil
}
