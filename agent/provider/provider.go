// Package provider is the agent loop's view of a language model: one call
// takes the conversation and the tools on offer and returns the assistant's
// next turn — text, tool calls, or both. The shapes follow what OpenAI chat
// completions and Anthropic messages both express (a separate system prompt,
// tool calls with ids, one tool result per call), so their clients can be
// added behind the same interface. Chain puts several providers in order
// with retries, fallback and compaction.
package provider

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Role says who produced a message.
type Role string

// Roles of conversation messages.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool" // the result of one tool call
)

// Message is one entry of the conversation.
type Message struct {
	Role Role
	// Text is the user's or assistant's text, or a tool call's output.
	Text string
	// ToolCalls are the calls an assistant message requested.
	ToolCalls []ToolCall
	// ToolCallID and ToolName tie a RoleTool message to the call it answers.
	ToolCallID string
	ToolName   string
	// IsError marks a RoleTool message whose Text is an error, not output.
	IsError bool
}

// ToolCall is the model asking to run one tool.
type ToolCall struct {
	ID   string
	Name string
	Args json.RawMessage // as the model wrote them; may be invalid
}

// Tool describes a tool the model may call.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema of the arguments object
}

// Conversation is everything the model sees.
type Conversation struct {
	System   string
	Messages []Message
}

// Turn is the assistant's answer to one Complete call. No ToolCalls means
// Text is the final reply.
type Turn struct {
	Text      string
	ToolCalls []ToolCall
}

// Usage is what one call consumed.
type Usage struct {
	InputTokens  int
	OutputTokens int
}

// Provider is a language model.
type Provider interface {
	Complete(ctx context.Context, conv Conversation, tools []Tool) (Turn, Usage, error)
}

// New returns the provider cfg names: "local", "openai" (and every
// OpenAI-compatible server through base_url) or "anthropic".
func New(cfg agentproto.Provider) (Provider, error) {
	switch cfg.Kind {
	case "local":
		return Local{}, nil
	case "openai":
		return NewOpenAI(cfg, nil)
	case "anthropic":
		return NewAnthropic(cfg, nil)
	default:
		return nil, fmt.Errorf("provider kind %q not available in this build", cfg.Kind)
	}
}
