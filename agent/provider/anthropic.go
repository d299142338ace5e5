package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/berth-dev/berth/internal/agentproto"
)

// AnthropicDefaultMaxTokens is max_tokens when the provider sets none (the
// messages API requires one).
const AnthropicDefaultMaxTokens = 4096

// Anthropic speaks the messages API (kind "anthropic"). The SDK's own
// retries and its environment and profile lookup are off: the key comes
// from the request only, and Chain retries.
type Anthropic struct {
	client    anthropic.Client
	model     string
	maxTokens int
	redact    func(string) string
}

// NewAnthropic returns the provider cfg describes. httpClient nil means a
// client with CallTimeout.
func NewAnthropic(cfg agentproto.Provider, httpClient *http.Client) (*Anthropic, error) {
	if cfg.Model == "" {
		return nil, fmt.Errorf("provider %q has no model", cfg.Name)
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: CallTimeout}
	}
	opts := []option.RequestOption{
		option.WithoutEnvironmentDefaults(),
		option.WithMaxRetries(0),
		option.WithHTTPClient(httpClient),
	}
	if cfg.Key != "" {
		// Without a key (the egress proxy adds it) the client sends no
		// credential of its own, not even an empty one.
		opts = append(opts, option.WithAPIKey(cfg.Key))
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	maxTokens := cfg.MaxTokens
	if maxTokens <= 0 {
		maxTokens = AnthropicDefaultMaxTokens
	}
	return &Anthropic{client: anthropic.NewClient(opts...), model: cfg.Model, maxTokens: maxTokens, redact: redactor(cfg.Key)}, nil
}

// Complete implements Provider.
func (p *Anthropic) Complete(ctx context.Context, conv Conversation, tools []Tool) (Turn, Usage, error) {
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(p.model),
		MaxTokens: int64(p.maxTokens),
		Messages:  anthropicMessages(conv.Messages),
	}
	if conv.System != "" {
		params.System = []anthropic.TextBlockParam{{Text: conv.System}}
	}
	for _, t := range tools {
		var schema struct {
			Properties any      `json:"properties"`
			Required   []string `json:"required"`
		}
		if err := json.Unmarshal(t.Parameters, &schema); err != nil {
			return Turn{}, Usage{}, fmt.Errorf("tool %s has a bad schema: %w", t.Name, err)
		}
		if schema.Properties == nil {
			schema.Properties = map[string]any{}
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name:        t.Name,
			Description: anthropic.String(t.Description),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: schema.Properties, Required: schema.Required},
		}})
	}

	resp, err := p.client.Messages.New(ctx, params)
	if err != nil {
		return Turn{}, Usage{}, p.wrap(err)
	}
	usage := Usage{InputTokens: int(resp.Usage.InputTokens), OutputTokens: int(resp.Usage.OutputTokens)}
	var turn Turn
	for _, block := range resp.Content {
		switch block.Type {
		case "text":
			turn.Text += block.Text
		case "tool_use":
			turn.ToolCalls = append(turn.ToolCalls, ToolCall{ID: block.ID, Name: block.Name, Args: block.Input})
		}
	}
	if resp.StopReason == anthropic.StopReasonModelContextWindowExceeded && len(turn.ToolCalls) == 0 && turn.Text == "" {
		return Turn{}, usage, &Error{Class: ContextOverflow, Msg: "model context window exceeded"}
	}
	return turn, usage, nil
}

// anthropicMessages maps the conversation to alternating user and assistant
// messages: consecutive tool results become one user message of
// tool_result blocks, and consecutive messages of one role are merged.
func anthropicMessages(msgs []Message) []anthropic.MessageParam {
	var out []anthropic.MessageParam
	var blocks []anthropic.ContentBlockParamUnion
	role := ""
	flush := func() {
		if len(blocks) == 0 {
			return
		}
		if role == "assistant" {
			out = append(out, anthropic.NewAssistantMessage(blocks...))
		} else {
			out = append(out, anthropic.NewUserMessage(blocks...))
		}
		blocks = nil
	}
	for _, m := range msgs {
		r := "user"
		if m.Role == RoleAssistant {
			r = "assistant"
		}
		if r != role {
			flush()
			role = r
		}
		switch m.Role {
		case RoleAssistant:
			if m.Text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Text))
			}
			for _, c := range m.ToolCalls {
				var input any = json.RawMessage(c.Args)
				if !json.Valid(c.Args) {
					input = map[string]any{}
				}
				blocks = append(blocks, anthropic.NewToolUseBlock(c.ID, input, c.Name))
			}
		case RoleTool:
			blocks = append(blocks, anthropic.NewToolResultBlock(m.ToolCallID, m.Text, m.IsError))
		default:
			blocks = append(blocks, anthropic.NewTextBlock(m.Text))
		}
	}
	flush()
	return out
}

// wrap turns an SDK error into an *Error without the key.
func (p *Anthropic) wrap(err error) error {
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		return connectionError(err, p.redact)
	}
	msg := apiErr.Message
	if msg == "" {
		msg = apiErr.RawJSON()
	}
	e := &Error{
		Class:  classifyStatus(apiErr.StatusCode, string(apiErr.Type()), msg),
		Status: apiErr.StatusCode,
		Msg:    p.redact(truncate(msg, 500)),
	}
	if apiErr.Response != nil {
		e.RetryAfter = retryAfter(apiErr.Response.Header, time.Now())
		e.RefusedByEgress = apiErr.Response.Header.Get(EgressRefusedHeader) == "refused"
	}
	return e
}
