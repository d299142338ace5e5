package provider

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// reply is one canned answer of a fake model API.
type reply struct {
	status int
	header map[string]string
	body   string
}

// fakeAPI is an in-process model API: it answers each request with the
// next canned reply (the last one repeats) and records what it got.
type fakeAPI struct {
	srv      *httptest.Server
	mu       sync.Mutex
	replies  []reply
	paths    []string
	bodies   []map[string]any
	headers  []http.Header
	requests int
}

func newFakeAPI(t *testing.T, replies ...reply) *fakeAPI {
	t.Helper()
	f := &fakeAPI{replies: replies}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		f.mu.Lock()
		i := min(f.requests, len(f.replies)-1)
		f.requests++
		f.paths = append(f.paths, r.URL.Path)
		f.bodies = append(f.bodies, body)
		f.headers = append(f.headers, r.Header.Clone())
		rep := f.replies[i]
		f.mu.Unlock()
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		if rep.status == 0 {
			rep.status = http.StatusOK
		}
		w.WriteHeader(rep.status)
		_, _ = io.WriteString(w, rep.body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

func (f *fakeAPI) body(i int) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[i]
}

// OpenAI chat-completions answers.

func oaText(text string) reply {
	return reply{body: fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}],
"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`, text)}
}

func oaToolCall(id, name, args string) reply {
	return reply{body: fmt.Sprintf(`{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m",
"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,
"tool_calls":[{"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]}}],
"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`, id, name, args)}
}

func oaError(status int, code, message string, header map[string]string) reply {
	return reply{status: status, header: header, body: fmt.Sprintf(`{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":%q}}`, message, code)}
}

// Anthropic messages answers.

func anText(text string) reply {
	return reply{body: fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":"m",
"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,
"usage":{"input_tokens":13,"output_tokens":5}}`, text)}
}

func anToolUse(id, name, input string) reply {
	return reply{body: fmt.Sprintf(`{"id":"msg_2","type":"message","role":"assistant","model":"m",
"content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":%q,"name":%q,"input":%s}],
"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":4}}`, id, name, input)}
}

func anError(status int, typ, message string, header map[string]string) reply {
	return reply{status: status, header: header, body: fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, message)}
}
