package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/berth-dev/berth/internal/agentproto"
)

// OpenAIDefaultBaseURL is used when a provider of kind "openai" has no base_url.
const OpenAIDefaultBaseURL = "https://api.openai.com/v1/"

// CallTimeout bounds one HTTP call to a model API.
const CallTimeout = 3 * time.Minute

// OpenAI speaks chat completions (kind "openai"): OpenAI itself or any
// compatible server (Ollama, vLLM, llama.cpp) named by base_url. The SDK's
// own retries are off: Chain retries, so the behaviour is berth's.
type OpenAI struct {
	client    openai.Client
	model     string
	maxTokens int
	official  bool // OpenAI itself (no base_url, directly or through the egress proxy): max_completion_tokens instead of max_tokens
	redact    func(string) string
}

// NewOpenAI returns the provider cfg describes. httpClient nil means a
// client with CallTimeout. An empty key sends no Authorization (a local
// server without one, or the egress proxy, which adds the real one).
func NewOpenAI(cfg agentproto.Provider, httpClient *http.Client) (*OpenAI, error) {
	if cfg.Model == "" {
		return nil, fmt.Errorf("provider %q has no model", cfg.Name)
	}
	base := cfg.BaseURL
	if base == "" {
		base = OpenAIDefaultBaseURL
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: CallTimeout}
	}
	client := openai.NewClient(
		option.WithBaseURL(base),
		option.WithAPIKey(cfg.Key),
		option.WithMaxRetries(0),
		option.WithHTTPClient(httpClient),
	)
	return &OpenAI{client: client, model: cfg.Model, maxTokens: cfg.MaxTokens, official: cfg.BaseURL == "" || (cfg.Proxied && cfg.Endpoint == ""), redact: redactor(cfg.Key)}, nil
}

// Complete implements Provider.
func (p *OpenAI) Complete(ctx context.Context, conv Conversation, tools []Tool) (Turn, Usage, error) {
	params := openai.ChatCompletionNewParams{Model: shared.ChatModel(p.model)}
	if conv.System != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(conv.System))
	}
	for _, m := range conv.Messages {
		params.Messages = append(params.Messages, openAIMessage(m))
	}
	for _, t := range tools {
		var schema map[string]any
		if err := json.Unmarshal(t.Parameters, &schema); err != nil {
			return Turn{}, Usage{}, fmt.Errorf("tool %s has a bad schema: %w", t.Name, err)
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        t.Name,
			Description: openai.String(t.Description),
			Parameters:  shared.FunctionParameters(schema),
		}))
	}
	if p.maxTokens > 0 {
		if p.official {
			params.MaxCompletionTokens = openai.Int(int64(p.maxTokens))
		} else {
			params.MaxTokens = openai.Int(int64(p.maxTokens))
		}
	}

	resp, err := p.client.Chat.Completions.New(ctx, params)
	if err != nil {
		return Turn{}, Usage{}, p.wrap(err)
	}
	usage := Usage{InputTokens: int(resp.Usage.PromptTokens), OutputTokens: int(resp.Usage.CompletionTokens)}
	if len(resp.Choices) == 0 {
		return Turn{}, usage, &Error{Class: Fatal, Msg: "the model returned no choices"}
	}
	msg := resp.Choices[0].Message
	turn := Turn{Text: msg.Content}
	for _, tc := range msg.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			continue
		}
		turn.ToolCalls = append(turn.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Args: json.RawMessage(tc.Function.Arguments)})
	}
	return turn, usage, nil
}

func openAIMessage(m Message) openai.ChatCompletionMessageParamUnion {
	switch m.Role {
	case RoleAssistant:
		a := openai.ChatCompletionAssistantMessageParam{}
		if m.Text != "" || len(m.ToolCalls) == 0 {
			a.Content.OfString = openai.String(m.Text)
		}
		for _, c := range m.ToolCalls {
			a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID:       c.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: string(c.Args)},
				},
			})
		}
		return openai.ChatCompletionMessageParamUnion{OfAssistant: &a}
	case RoleTool:
		text := m.Text
		if m.IsError {
			text = "ERROR: " + text
		}
		return openai.ToolMessage(text, m.ToolCallID)
	default:
		return openai.UserMessage(m.Text)
	}
}

// wrap turns an SDK error into an *Error without the key.
func (p *OpenAI) wrap(err error) error {
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		return connectionError(err, p.redact)
	}
	msg := apiErr.Message
	if msg == "" {
		msg = apiErr.RawJSON()
	}
	e := &Error{
		Class:  classifyStatus(apiErr.StatusCode, apiErr.Code+" "+apiErr.Type, msg),
		Status: apiErr.StatusCode,
		Msg:    p.redact(truncate(msg, 500)),
	}
	if apiErr.Response != nil {
		e.RetryAfter = retryAfter(apiErr.Response.Header, time.Now())
		e.RefusedByEgress = apiErr.Response.Header.Get(EgressRefusedHeader) == "refused"
	}
	return e
}
