package provider

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
)

const testKey = "sk-test-key-never-shown"

var shellSpec = Tool{Name: "shell", Description: "run", Parameters: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`)}

// toolRound is a conversation in the middle of a tool loop.
var toolRound = Conversation{
	System: "You are Ada.",
	Messages: []Message{
		{Role: RoleUser, Text: "how full is the disk?"},
		{Role: RoleAssistant, Text: "checking", ToolCalls: []ToolCall{{ID: "call_1", Name: "shell", Args: json.RawMessage(`{"command":"df -h"}`)}}},
		{Role: RoleTool, ToolCallID: "call_1", ToolName: "shell", Text: "42% used"},
	},
}

func openAIProvider(t *testing.T, f *fakeAPI) Provider {
	t.Helper()
	p, err := NewOpenAI(agentproto.Provider{Name: "oa", Kind: "openai", BaseURL: f.srv.URL + "/v1", Model: "gpt-test", Key: testKey, MaxTokens: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func anthropicProvider(t *testing.T, f *fakeAPI) Provider {
	t.Helper()
	p, err := NewAnthropic(agentproto.Provider{Name: "an", Kind: "anthropic", BaseURL: f.srv.URL, Model: "claude-test", Key: testKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenAISpeaksChatCompletionsWithTools(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, oaToolCall("call_2", "shell", `{"command":"du -sh /var"}`))
	turn, usage, err := openAIProvider(t, f).Complete(context.Background(), toolRound, []Tool{shellSpec})
	if err != nil {
		t.Fatal(err)
	}
	want := Turn{ToolCalls: []ToolCall{{ID: "call_2", Name: "shell", Args: json.RawMessage(`{"command":"du -sh /var"}`)}}}
	if !reflect.DeepEqual(turn, want) || usage != (Usage{InputTokens: 5, OutputTokens: 3}) {
		t.Errorf("turn = %+v, usage %+v; want %+v", turn, usage, want)
	}
	if f.paths[0] != "/v1/chat/completions" {
		t.Errorf("path = %s, want /v1/chat/completions", f.paths[0])
	}
	if got := f.headers[0].Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization = %q", got)
	}
	body := f.body(0)
	msgs := body["messages"].([]any)
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.(map[string]any)["role"].(string))
	}
	if !reflect.DeepEqual(roles, []string{"system", "user", "assistant", "tool"}) {
		t.Errorf("roles = %v", roles)
	}
	call := msgs[2].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
	if call["id"] != "call_1" || call["type"] != "function" || call["function"].(map[string]any)["arguments"] != `{"command":"df -h"}` {
		t.Errorf("assistant tool call = %v", call)
	}
	if res := msgs[3].(map[string]any); res["tool_call_id"] != "call_1" || res["content"] != "42% used" {
		t.Errorf("tool result = %v", res)
	}
	tool := body["tools"].([]any)[0].(map[string]any)
	if tool["type"] != "function" || tool["function"].(map[string]any)["name"] != "shell" {
		t.Errorf("tool = %v", tool)
	}
	if body["model"] != "gpt-test" || body["max_tokens"] != float64(100) {
		t.Errorf("model = %v, max_tokens = %v", body["model"], body["max_tokens"])
	}
}

func TestAnthropicSpeaksMessagesWithTools(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, anToolUse("toolu_2", "shell", `{"command":"du -sh /var"}`))
	turn, usage, err := anthropicProvider(t, f).Complete(context.Background(), toolRound, []Tool{shellSpec})
	if err != nil {
		t.Fatal(err)
	}
	want := Turn{Text: "Let me look.", ToolCalls: []ToolCall{{ID: "toolu_2", Name: "shell", Args: json.RawMessage(`{"command":"du -sh /var"}`)}}}
	if !reflect.DeepEqual(turn, want) || usage != (Usage{InputTokens: 9, OutputTokens: 4}) {
		t.Errorf("turn = %+v, usage %+v; want %+v", turn, usage, want)
	}
	if f.paths[0] != "/v1/messages" {
		t.Errorf("path = %s, want /v1/messages", f.paths[0])
	}
	// The documented header is x-api-key; SDK v2 sends the key as a bearer token.
	if h := f.headers[0]; h.Get("X-Api-Key") != testKey && h.Get("Authorization") != "Bearer "+testKey {
		t.Errorf("no key in x-api-key or Authorization: %v", h)
	}
	if f.headers[0].Get("Anthropic-Version") == "" {
		t.Error("no anthropic-version header")
	}
	body := f.body(0)
	if sys := body["system"].([]any)[0].(map[string]any)["text"]; sys != "You are Ada." {
		t.Errorf("system = %v", sys)
	}
	msgs := body["messages"].([]any)
	if len(msgs) != 3 {
		t.Fatalf("messages = %v, want user, assistant, user(tool_result)", msgs)
	}
	blocks := msgs[1].(map[string]any)["content"].([]any)
	use := blocks[1].(map[string]any)
	if use["type"] != "tool_use" || use["id"] != "call_1" || use["input"].(map[string]any)["command"] != "df -h" {
		t.Errorf("tool_use block = %v", use)
	}
	result := msgs[2].(map[string]any)
	rb := result["content"].([]any)[0].(map[string]any)
	if result["role"] != "user" || rb["type"] != "tool_result" || rb["tool_use_id"] != "call_1" {
		t.Errorf("tool_result message = %v", result)
	}
	tool := body["tools"].([]any)[0].(map[string]any)
	if tool["name"] != "shell" || tool["input_schema"].(map[string]any)["type"] != "object" {
		t.Errorf("tool = %v", tool)
	}
	if body["max_tokens"] != float64(AnthropicDefaultMaxTokens) {
		t.Errorf("max_tokens = %v", body["max_tokens"])
	}
}

// sleeps records the chain's back-off instead of waiting.
type sleeps struct{ got []time.Duration }

func (s *sleeps) sleep(_ context.Context, d time.Duration) error {
	s.got = append(s.got, d)
	return nil
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func chainOf(s *sleeps, named ...Named) *Chain {
	return &Chain{Providers: named, Retry: DefaultRetry, Log: quietLog(), Sleep: s.sleep}
}

func TestChainRetriesAndFallsBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		primary    []reply
		wantCalls  int // calls to the primary
		wantSleeps []time.Duration
		wantText   string
	}{
		{
			name:       "Server_errors_are_retried_with_exponential_back_off_then_fall_through",
			primary:    []reply{oaError(500, "", "boom", nil)},
			wantCalls:  3,
			wantSleeps: []time.Duration{time.Second, 2 * time.Second},
			wantText:   "from the fallback",
		},
		{
			name:       "A_429_waits_as_long_as_Retry_After_says",
			primary:    []reply{oaError(429, "rate_limit_exceeded", "slow down", map[string]string{"Retry-After": "7"}), oaText("from the primary")},
			wantCalls:  2,
			wantSleeps: []time.Duration{7 * time.Second},
			wantText:   "from the primary",
		},
		{
			name:       "Retry_After_ms_is_honoured",
			primary:    []reply{oaError(429, "", "slow down", map[string]string{"Retry-After-Ms": "250"}), oaText("from the primary")},
			wantCalls:  2,
			wantSleeps: []time.Duration{250 * time.Millisecond},
			wantText:   "from the primary",
		},
		{
			name:      "A_Retry_After_beyond_the_cap_falls_through_at_once",
			primary:   []reply{oaError(429, "", "come back tomorrow", map[string]string{"Retry-After": "86400"})},
			wantCalls: 1,
			wantText:  "from the fallback",
		},
		{
			name:       "A_529_overload_is_transient",
			primary:    []reply{oaError(529, "", "overloaded", nil), oaError(503, "", "unavailable", nil), oaText("third time")},
			wantCalls:  3,
			wantSleeps: []time.Duration{time.Second, 2 * time.Second},
			wantText:   "third time",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary := newFakeAPI(t, tc.primary...)
			fallback := newFakeAPI(t, anText("from the fallback"))
			s := &sleeps{}
			c := chainOf(s, Named{"primary", openAIProvider(t, primary)}, Named{"fallback", anthropicProvider(t, fallback)})
			conv := Conversation{Messages: []Message{{Role: RoleUser, Text: "hi"}}}
			turn, _, err := c.Complete(context.Background(), &conv, nil)
			if err != nil {
				t.Fatal(err)
			}
			if turn.Text != tc.wantText || primary.count() != tc.wantCalls || !reflect.DeepEqual(s.got, tc.wantSleeps) {
				t.Errorf("text %q, primary calls %d, sleeps %v; want %q, %d, %v", turn.Text, primary.count(), s.got, tc.wantText, tc.wantCalls, tc.wantSleeps)
			}
		})
	}
}

func TestChainTriesProvidersInOrder(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close() // connection refused from now on
	first, err := NewOpenAI(agentproto.Provider{Name: "first", BaseURL: downURL, Model: "m", Key: testKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	second := newFakeAPI(t, anError(503, "api_error", "down", nil))
	third := newFakeAPI(t, oaText("third answers"))
	s := &sleeps{}
	c := chainOf(s, Named{"first", first}, Named{"second", anthropicProvider(t, second)}, Named{"third", openAIProvider(t, third)})
	conv := Conversation{Messages: []Message{{Role: RoleUser, Text: "hi"}}}
	turn, _, err := c.Complete(context.Background(), &conv, nil)
	if err != nil || turn.Text != "third answers" {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
	if second.count() != 3 || third.count() != 1 || len(s.got) != 4 {
		t.Errorf("second called %d times, third %d, %d sleeps; want 3, 1, 4", second.count(), third.count(), len(s.got))
	}
}

func TestChainStopsAtFatalErrorsWithoutTheKey(t *testing.T) {
	t.Parallel()
	primary := newFakeAPI(t, oaError(401, "invalid_api_key", "Incorrect API key provided: "+testKey, nil))
	fallback := newFakeAPI(t, oaText("never"))
	c := chainOf(&sleeps{}, Named{"primary", openAIProvider(t, primary)}, Named{"fallback", openAIProvider(t, fallback)})
	conv := Conversation{Messages: []Message{{Role: RoleUser, Text: "hi"}}}
	_, _, err := c.Complete(context.Background(), &conv, nil)
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), `provider "primary"`) {
		t.Fatalf("err = %v, want the primary's 401", err)
	}
	if strings.Contains(err.Error(), testKey) {
		t.Errorf("the key leaked into the error: %v", err)
	}
	if primary.count() != 1 || fallback.count() != 0 {
		t.Errorf("primary called %d times, fallback %d; want 1, 0", primary.count(), fallback.count())
	}
}

func TestEveryProviderFailingNamesEach(t *testing.T) {
	t.Parallel()
	a := newFakeAPI(t, oaError(500, "", "a is down", nil))
	b := newFakeAPI(t, anError(529, "overloaded_error", "b is overloaded", nil))
	c := chainOf(&sleeps{}, Named{"a", openAIProvider(t, a)}, Named{"b", anthropicProvider(t, b)})
	conv := Conversation{Messages: []Message{{Role: RoleUser, Text: "hi"}}}
	_, _, err := c.Complete(context.Background(), &conv, nil)
	if err == nil || !strings.Contains(err.Error(), "every provider failed") || !strings.Contains(err.Error(), "a is down") || !strings.Contains(err.Error(), "b is overloaded") {
		t.Fatalf("err = %v", err)
	}
}

func history() Conversation {
	return Conversation{System: "soul", Messages: []Message{
		{Role: RoleUser, Text: "old question"},
		{Role: RoleAssistant, Text: "old answer"},
		{Role: RoleUser, Text: "new question"},
		{Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "c1", Name: "shell", Args: json.RawMessage(`{}`)}}},
		{Role: RoleTool, ToolCallID: "c1", ToolName: "shell", Text: strings.Repeat("x", 10000)},
		{Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "c2", Name: "shell", Args: json.RawMessage(`{}`)}}},
		{Role: RoleTool, ToolCallID: "c2", ToolName: "shell", Text: strings.Repeat("y", 10000)},
	}}
}

func TestCompactDropsHistoryAndTrimsEarlierToolResults(t *testing.T) {
	t.Parallel()
	conv := history()
	dropped, trimmed := Compact(&conv)
	if dropped != 2 || trimmed != 1 {
		t.Errorf("dropped %d, trimmed %d; want 2, 1", dropped, trimmed)
	}
	if conv.Messages[0].Text != "new question" || !strings.HasSuffix(conv.System, CompactedNote) {
		t.Errorf("first message %q, system %q", conv.Messages[0].Text, conv.System)
	}
	if len(conv.Messages[2].Text) > CompactedToolResult+100 || len(conv.Messages[4].Text) != 10000 {
		t.Errorf("tool results are %d and %d bytes; want the earlier one cut, the latest whole", len(conv.Messages[2].Text), len(conv.Messages[4].Text))
	}
	if d, tr := Compact(&conv); d != 0 || tr != 0 {
		t.Errorf("a second Compact changed %d, %d", d, tr)
	}
}

func TestContextOverflowCompactsAndRetriesOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		overflow reply
		ok       reply
		newP     func(*testing.T, *fakeAPI) Provider
	}{
		{"OpenAI_context_length_exceeded", oaError(400, "context_length_exceeded", "This model's maximum context length is 8192 tokens", nil), oaText("fits now"), openAIProvider},
		{"Anthropic_prompt_is_too_long", anError(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum", nil), anText("fits now"), anthropicProvider},
		{"llama_cpp_exceeds_context_size", oaError(400, "", "the request exceeds the available context size, try increasing it", nil), oaText("fits now"), openAIProvider},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t, tc.overflow, tc.ok)
			c := chainOf(&sleeps{}, Named{"p", tc.newP(t, f)})
			conv := history()
			turn, _, err := c.Complete(context.Background(), &conv, nil)
			if err != nil || turn.Text != "fits now" {
				t.Fatalf("turn %+v, err %v", turn, err)
			}
			before, after := len(f.body(0)["messages"].([]any)), len(f.body(1)["messages"].([]any))
			if after >= before {
				t.Errorf("the retry sent %d messages, the first call %d; want fewer", after, before)
			}
			if len(conv.Messages) != 5 {
				t.Errorf("the caller's conversation has %d messages, want the compacted 5", len(conv.Messages))
			}
		})
	}
	t.Run("A_second_overflow_ends_the_turn", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t, oaError(400, "context_length_exceeded", "too long", nil))
		c := chainOf(&sleeps{}, Named{"p", openAIProvider(t, f)})
		conv := history()
		_, _, err := c.Complete(context.Background(), &conv, nil)
		if err == nil || !strings.Contains(err.Error(), "even after compacting") || f.count() != 2 {
			t.Errorf("err = %v after %d calls; want an overflow after 2", err, f.count())
		}
	})
}

func TestRetryAfterParsesSecondsDatesAndMilliseconds(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{"Seconds", http.Header{"Retry-After": {"3"}}, 3 * time.Second},
		{"HTTP_date", http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{"Milliseconds_win", http.Header{"Retry-After": {"3"}, "Retry-After-Ms": {"1500"}}, 1500 * time.Millisecond},
		{"Garbage_is_no_hint", http.Header{"Retry-After": {"soon"}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := retryAfter(tc.header, now); got != tc.want {
				t.Errorf("retryAfter = %v, want %v", got, tc.want)
			}
		})
	}
}
