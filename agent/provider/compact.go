package provider

import "fmt"

// CompactedToolResult is how much of an earlier tool result Compact keeps.
const CompactedToolResult = 2 << 10

// CompactedNote joins the system prompt once the history was dropped.
const CompactedNote = "(Earlier messages of this conversation were dropped to fit the model's context window.)"

// Compact makes conv smaller after a context overflow, keeping it valid for
// every provider (a tool result always follows the call it answers):
//
//   - every message before the current user message — the conversation
//     history the scheduler passed in — is dropped, and CompactedNote is
//     added to the system prompt;
//   - tool results of earlier steps of this run (all but the latest batch)
//     are cut to CompactedToolResult bytes with a marker.
//
// The system prompt, the current user message and the latest tool results
// stay whole. It returns how many messages it dropped and how many tool
// results it cut.
func Compact(conv *Conversation) (dropped, trimmed int) {
	current := -1
	for i := len(conv.Messages) - 1; i >= 0; i-- {
		if conv.Messages[i].Role == RoleUser {
			current = i
			break
		}
	}
	if current > 0 {
		dropped = current
		conv.Messages = append([]Message(nil), conv.Messages[current:]...)
		conv.System += "\n\n" + CompactedNote
	}
	lastAssistant := -1
	for i := len(conv.Messages) - 1; i >= 0; i-- {
		if conv.Messages[i].Role == RoleAssistant {
			lastAssistant = i
			break
		}
	}
	for i := 0; i < lastAssistant; i++ {
		m := &conv.Messages[i]
		if m.Role == RoleTool && len(m.Text) > CompactedToolResult+compactMarkerRoom {
			m.Text = fmt.Sprintf("%s\n[... %d bytes dropped to fit the context window]", m.Text[:CompactedToolResult], len(m.Text)-CompactedToolResult)
			trimmed++
		}
	}
	return dropped, trimmed
}

// compactMarkerRoom leaves a cut result (text plus marker) alone next time.
const compactMarkerRoom = 128
