package egress_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

// calls collects the provider calls a proxy reports through OnCall, as
// berth-egress hands them to the scheduler.
type calls struct {
	mu      sync.Mutex
	got     []egresspolicy.Call
	arrived chan struct{} // one per call
}

func newCalls() *calls { return &calls{arrived: make(chan struct{}, 1024)} }

func (c *calls) add(call egresspolicy.Call) {
	c.mu.Lock()
	c.got = append(c.got, call)
	c.mu.Unlock()
	c.arrived <- struct{}{}
}

// wait returns the calls once n have been reported (a call is reported
// once its answer is relayed, which a client may see the end of first).
func (c *calls) wait(t *testing.T, n int) []egresspolicy.Call {
	t.Helper()
	for len(c.all()) < n {
		select {
		case <-c.arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d calls reported, want %d", len(c.all()), n)
		}
	}
	return c.all()
}

func (c *calls) all() []egresspolicy.Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]egresspolicy.Call(nil), c.got...)
}

// A fake provider speaking the documented wire formats: OpenAI's chat
// completions (JSON, and SSE ending in a usage chunk when
// stream_options.include_usage), OpenAI's responses (SSE ending in
// response.completed) and Anthropic's messages (JSON, and SSE with
// message_start and message_delta usage).
var (
	openAIChatJSON = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,"prompt_tokens_details":{"cached_tokens":1000},"completion_tokens_details":{"reasoning_tokens":0}},"system_fingerprint":"fp_1"}`
	openAIChatSSE = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":9,\"total_tokens\":49,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n" +
		"data: [DONE]\n\n"
	openAIResponsesSSE = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":70,\"input_tokens_details\":{\"cached_tokens\":20},\"output_tokens\":11,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":81}}}\n\n"
	anthropicJSON = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":50,"cache_creation_input_tokens":100,"cache_read_input_tokens":400,"output_tokens":25}}`
	anthropicSSE = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":200,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hello\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":17}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

// fakeProvider answers each call with answer (a JSON body, or SSE when it
// starts with "data:" or "event:"), written in pieces of at most 7 bytes
// so that every event is split across writes.
func fakeProvider(t *testing.T, answer func(r *http.Request) string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		a := answer(r)
		if strings.HasPrefix(a, "data:") || strings.HasPrefix(a, "event:") {
			w.Header().Set("Content-Type", "text/event-stream")
			for len(a) > 0 {
				n := min(7, len(a))
				io.WriteString(w, a[:n])
				w.(http.Flusher).Flush()
				a = a[n:]
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, a)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func usageProxy(t *testing.T, kind string, srv *httptest.Server, allowance *egresspolicy.Allowance, opts egress.Options) (proxy, *calls) {
	t.Helper()
	got := newCalls()
	base := srv.URL + "/v1"
	if kind == "anthropic" {
		base = srv.URL
	}
	pr := egress.Provider{Name: "llm", Kind: kind, BaseURL: base, Model: "m1", Key: openKey,
		Prices: map[string]egresspolicy.Price{"m1": {Input: 2, Output: 10, Cached: 0.5}}}
	opts.OnCall = got.add
	return startProxy(t, egress.Policy{RunID: "r1", Agent: "ops", Providers: []egress.Provider{pr}, Allowance: allowance}, opts), got
}

func TestTheProxyReadsUsageFromEveryAnswerShape(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 200<<10) // past the window kept whole: usage read from the tail
	tests := []struct {
		name, kind, endpoint, answer string
		want                         egresspolicy.Tokens
	}{
		{"OpenAI_chat_JSON_with_cached_tokens", "openai", "chat/completions", fmt.Sprintf(openAIChatJSON, "hi"), egresspolicy.Tokens{Input: 1200, Output: 300, Cached: 1000}},
		{"OpenAI_chat_JSON_longer_than_the_window", "openai", "chat/completions", fmt.Sprintf(openAIChatJSON, long), egresspolicy.Tokens{Input: 1200, Output: 300, Cached: 1000}},
		{"OpenAI_chat_streamed_with_include_usage", "openai", "chat/completions", openAIChatSSE, egresspolicy.Tokens{Input: 40, Output: 9, Cached: 8}},
		{"OpenAI_responses_streamed", "openai", "responses", openAIResponsesSSE, egresspolicy.Tokens{Input: 70, Output: 11, Cached: 20}},
		{"Anthropic_JSON_with_cache_reads_and_writes", "anthropic", "v1/messages", anthropicJSON, egresspolicy.Tokens{Input: 550, Output: 25, Cached: 400}},
		{"Anthropic_streamed_message_start_and_delta", "anthropic", "v1/messages", anthropicSSE, egresspolicy.Tokens{Input: 230, Output: 17, Cached: 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := fakeProvider(t, func(*http.Request) string { return tt.answer })
			p, got := usageProxy(t, tt.kind, srv, nil, egress.Options{})
			code, body := do(t, p.origin(token), "POST", "http://egress/providers/llm/"+tt.endpoint, `{"model":"m1","stream":true}`)
			if code != 200 || body != tt.answer {
				t.Fatalf("the sandbox got %d and %d bytes, want 200 and the answer unchanged (%d bytes)", code, len(body), len(tt.answer))
			}
			cs := got.wait(t, 1)
			if len(cs) != 1 {
				t.Fatalf("reported %d calls, want 1: %+v", len(cs), cs)
			}
			c := cs[0]
			if c.Tokens != tt.want || c.Provider != "llm" || c.Model != "m1" || c.Status != 200 || c.Seq != 1 || c.UsageUnknown {
				t.Fatalf("call = %+v, want tokens %+v", c, tt.want)
			}
			want := egresspolicy.Price{Input: 2, Output: 10, Cached: 0.5}.Cost(tt.want)
			if !c.Priced || c.Cost != want || want == 0 {
				t.Fatalf("cost = %v (priced %v), want %v", c.Cost, c.Priced, want)
			}
			line, _ := json.Marshal(c)
			if strings.Contains(string(line), openKey) || strings.Contains(string(line), "hello") {
				t.Fatalf("the call record carries the key or the answer: %s", line)
			}
		})
	}
}

func TestAStreamReachesTheSandboxBeforeItEnds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"first\"}}],\"usage\":null}\n\n")
		w.(http.Flusher).Flush()
		<-release // the rest only once the sandbox has read the first event
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	p, got := usageProxy(t, "openai", srv, nil, egress.Options{})
	req, _ := http.NewRequest("POST", "http://egress/providers/llm/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
	resp, err := p.origin(token).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, "first") {
		t.Fatalf("first line %q, %v", first, err)
	}
	close(release)
	io.Copy(io.Discard, br)
	resp.Body.Close()
	if c := got.wait(t, 1)[0]; c.Input != 3 || c.Output != 2 {
		t.Fatalf("call = %+v, want 3 in, 2 out", c)
	}
}

func TestAnAnswerWithoutUsageIsReportedAsUnknown(t *testing.T) {
	t.Parallel()
	srv := fakeProvider(t, func(*http.Request) string { return `{"choices":[{"message":{"content":"hi"}}]}` })
	p, got := usageProxy(t, "openai", srv, nil, egress.Options{})
	if code, _ := do(t, p.origin(token), "POST", "http://egress/providers/llm/chat/completions", `{"model":"m1"}`); code != 200 {
		t.Fatalf("code %d", code)
	}
	if c := got.wait(t, 1); len(c) != 1 || !c[0].UsageUnknown || c[0].Total() != 0 {
		t.Fatalf("calls = %+v, want one with usage unknown", c)
	}
}
