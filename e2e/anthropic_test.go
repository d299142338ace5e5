package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

const anthropicKey = "sk-ant-e2e-fake-anthropic-key"

// busyModel is the model the fake Anthropic server is always overloaded for.
const busyModel = "claude-busy"

// anBlock is one content block of the messages API, in either direction.
type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"` // tool_result: a string or text blocks
	IsError   bool            `json:"is_error,omitempty"`
}

// anMessage is one message of a request; Content is a string or blocks.
type anMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (m anMessage) blocks() ([]anBlock, error) {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []anBlock{{Type: "text", Text: s}}, nil
	}
	var bs []anBlock
	if err := json.Unmarshal(m.Content, &bs); err != nil {
		return nil, fmt.Errorf("content is neither a string nor blocks: %w", err)
	}
	return bs, nil
}

// resultText is a tool_result block's content as text.
func (b anBlock) resultText() string {
	var s string
	if json.Unmarshal(b.Content, &s) == nil {
		return s
	}
	var parts []anBlock
	_ = json.Unmarshal(b.Content, &parts)
	var out strings.Builder
	for _, p := range parts {
		out.WriteString(p.Text)
	}
	return out.String()
}

// anCall is one request the fake got.
type anCall struct {
	at      time.Time
	model   string
	auth    string // Authorization
	apiKey  string // X-Api-Key
	version string // anthropic-version
}

// fakeAnthropic speaks the Anthropic messages wire format on 127.0.0.1 and
// checks requests the way the API does (roles alternate, starting with the
// user; every tool_use is answered by a tool_result in the next message;
// max_tokens is set). It answers "run ..." with a shell tool_use, a
// tool_result with the command's exit code and stdout, and anything else with
// how many earlier messages it was given. For busyModel it answers 529
// overloaded_error without Retry-After, as the API does when it is overloaded.
type fakeAnthropic struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []anCall
	bad   []string // requests refused as malformed, with why
}

func newFakeAnthropic(t *testing.T) *fakeAnthropic {
	f := &fakeAnthropic{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fail := func(status int, typ, msg string) {
			w.WriteHeader(status)
			body, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
			_, _ = w.Write(body)
		}
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
			fail(http.StatusNotFound, "not_found_error", r.Method+" "+r.URL.Path)
			return
		}
		var req struct {
			Model     string          `json:"model"`
			MaxTokens int             `json:"max_tokens"`
			System    json.RawMessage `json:"system"`
			Messages  []anMessage     `json:"messages"`
			Tools     []struct {
				Name        string         `json:"name"`
				InputSchema map[string]any `json:"input_schema"`
			} `json:"tools"`
		}
		raw, _ := io.ReadAll(r.Body)
		call := anCall{at: time.Now(), auth: r.Header.Get("Authorization"), apiKey: r.Header.Get("X-Api-Key"), version: r.Header.Get("Anthropic-Version")}
		err := json.Unmarshal(raw, &req)
		call.model = req.Model
		f.mu.Lock()
		f.calls = append(f.calls, call)
		f.mu.Unlock()
		invalid := func(format string, args ...any) {
			msg := fmt.Sprintf(format, args...)
			f.mu.Lock()
			f.bad = append(f.bad, msg)
			f.mu.Unlock()
			fail(http.StatusBadRequest, "invalid_request_error", msg)
		}
		if err != nil {
			invalid("body: %v", err)
			return
		}
		if call.auth != "Bearer "+anthropicKey && call.apiKey != anthropicKey {
			fail(http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
			return
		}
		if call.version == "" {
			invalid("anthropic-version: header is required")
			return
		}
		if req.Model == busyModel {
			fail(529, "overloaded_error", "Overloaded")
			return
		}
		if req.Model == "" || req.MaxTokens <= 0 || len(req.Messages) == 0 {
			invalid("model, max_tokens and messages are required")
			return
		}
		hasShell := false
		for _, tool := range req.Tools {
			hasShell = hasShell || tool.Name == "shell" && tool.InputSchema["type"] == "object"
		}
		if !hasShell {
			invalid("tools: no shell tool with an object input_schema")
			return
		}
		var pending map[string]bool // tool_use ids the next message must answer
		var last []anBlock
		for i, m := range req.Messages {
			want := "user"
			if i%2 == 1 {
				want = "assistant"
			}
			if m.Role != want {
				invalid("messages.%d.role: %q, want %q (roles alternate, starting with user)", i, m.Role, want)
				return
			}
			bs, err := m.blocks()
			if err != nil || len(bs) == 0 {
				invalid("messages.%d.content: empty or malformed (%v)", i, err)
				return
			}
			answered := map[string]bool{}
			for j, b := range bs {
				switch {
				case b.Type == "tool_use" && m.Role == "assistant":
					if b.ID == "" || b.Name == "" || !json.Valid(b.Input) {
						invalid("messages.%d.content.%d: tool_use needs id, name and input", i, j)
						return
					}
				case b.Type == "tool_result" && m.Role == "user":
					if !pending[b.ToolUseID] {
						invalid("messages.%d.content.%d: tool_result for unknown tool_use %q", i, j, b.ToolUseID)
						return
					}
					answered[b.ToolUseID] = true
				case b.Type != "text":
					invalid("messages.%d.content.%d: unexpected %s block in a %s message", i, j, b.Type, m.Role)
					return
				}
			}
			for id := range pending {
				if !answered[id] {
					invalid("messages.%d: tool_use %s has no tool_result", i, id)
					return
				}
			}
			pending = map[string]bool{}
			for _, b := range bs {
				if b.Type == "tool_use" {
					pending[b.ID] = true
				}
			}
			last = bs
		}
		if len(pending) > 0 {
			invalid("the last message is an assistant message")
			return
		}

		var content []anBlock
		stop := "end_turn"
		switch {
		case last[0].Type == "tool_result":
			var out struct {
				Stdout   string `json:"stdout"`
				ExitCode int    `json:"exit_code"`
			}
			if err := json.Unmarshal([]byte(last[0].resultText()), &out); err != nil {
				invalid("tool_result: not the shell tool's JSON: %v", err)
				return
			}
			content = []anBlock{{Type: "text", Text: fmt.Sprintf("claude ran it: exit %d\n%s", out.ExitCode, out.Stdout)}}
		case strings.HasPrefix(last[len(last)-1].Text, "run "):
			input, _ := json.Marshal(map[string]string{"command": strings.TrimPrefix(last[len(last)-1].Text, "run ")})
			content = []anBlock{{Type: "text", Text: "Let me run that."}, {Type: "tool_use", ID: "toolu_e2e_1", Name: "shell", Input: input}}
			stop = "tool_use"
		default:
			content = []anBlock{{Type: "text", Text: fmt.Sprintf("claude heard %q after %d earlier messages", last[len(last)-1].Text, len(req.Messages)-1)}}
		}
		body, _ := json.Marshal(map[string]any{
			"id": "msg_e2e", "type": "message", "role": "assistant", "model": req.Model,
			"content": content, "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": 3, "output_tokens": 2},
		})
		_, _ = w.Write(body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// callsFor returns the requests for model, in order.
func (f *fakeAnthropic) callsFor(model string) []anCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []anCall
	for _, c := range f.calls {
		if c.model == model {
			out = append(out, c)
		}
	}
	return out
}

// startWithAnthropic runs the suite with the fake Anthropic server as
// primary and the fake OpenAI server as [providers] fallback. Agent "claude"
// (the default) uses the primary's model; agent "busy" (channel "busy")
// overrides it with busyModel, for which the primary is overloaded. The keys
// reach the scheduler through api_key_env only; on cleanup no log of the
// suite may contain either.
func startWithAnthropic(t *testing.T, claude *fakeAnthropic, gpt *fakeOpenAI) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "claude"
fallback = ["gpt"]

[providers.claude]
kind = "anthropic"
base_url = %q
api_key_env = "E2E_ANTHROPIC_KEY"
model = "claude-e2e"

[providers.gpt]
kind = "openai"
base_url = %q
api_key_env = "E2E_FAKE_KEY"
model = "gpt-e2e"

[[agents]]
id = "claude"
max_iterations = 4
[agents.file_access]
allow_network = true

[[agents]]
id = "busy"
model = %q
[agents.file_access]
allow_network = true

[intake]
default_agent = "claude"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[bindings]]
connector = "hooks"
channel_id = "busy"
agent = "busy"

[scheduler]
default_timeout_seconds = 60
run_as = "nobody"
agent_binary = %q
`, claude.srv.URL, gpt.srv.URL+"/v1", busyModel, secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	env := []string{"E2E_ANTHROPIC_KEY=" + anthropicKey, "E2E_FAKE_KEY=" + fakeKey}
	return launch(t, sink, cfg, env, anthropicKey, fakeKey)
}

// ask posts text in channel and thread and waits for the reply.
func (s *suite) ask(t *testing.T, channel, thread, text string) map[string]any {
	t.Helper()
	status, id := s.post(t, map[string]string{"channel": channel, "thread": thread, "author": "tester", "text": text})
	if status != http.StatusAccepted {
		t.Fatalf("POST %q: status %d", text, status)
	}
	return s.sink.wait(t, 60*time.Second, id)[id]
}

// runRecord returns the full run record of a reply.
func (s *suite) runRecord(t *testing.T, reply map[string]any) busapi.Run {
	t.Helper()
	runID, _ := reply["run_id"].(string)
	return s.getRun(t, runID)
}

// noKeyInRuns fails the test if any run record readable over D-Bus carries a key.
func (s *suite) noKeyInRuns(t *testing.T, keys ...string) {
	t.Helper()
	for _, summary := range s.listRuns(t, busapi.ListFilter{Limit: 100}) {
		r := s.getRun(t, summary.ID)
		for k, v := range r.Plain() {
			for _, key := range keys {
				if strings.Contains(fmt.Sprint(v), key) {
					t.Errorf("run %s exposes a provider key in %s", r.ID, k)
				}
			}
		}
	}
}

func TestAConfinedAgentTalksToAnAnthropicServerWithToolsAndFollowsTheThread(t *testing.T) {
	t.Parallel()
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithAnthropic(t, claude, gpt)

	for i, msg := range []string{"first", "second", "third"} {
		want := fmt.Sprintf("claude heard %q after %d earlier messages", msg, 2*i)
		if reply := s.ask(t, "general", "T1", msg); reply["state"] != "succeeded" || text(reply) != want {
			t.Fatalf("message %d: state %v, reply %q, error %v; want %q", i+1, reply["state"], text(reply), reply["error"], want)
		}
	}
	if reply := s.ask(t, "general", "T2", "elsewhere"); text(reply) != `claude heard "elsewhere" after 0 earlier messages` {
		t.Errorf("another thread saw history: %q", text(reply))
	}

	// A tool_use round trip: the model asks for shell, the agent runs it
	// confined as the agent's own uid and returns a tool_result the model
	// answers from.
	reply := s.ask(t, "general", "T3", "run echo $((6*7)); env; echo uid=$(id -u)")
	got := text(reply)
	_, ownUID := agentUIDAfter(got, "\nuid=")
	if reply["state"] != "succeeded" || !strings.HasPrefix(got, "claude ran it: exit 0\n42\n") || !ownUID || !strings.HasSuffix(got, "\n") {
		t.Errorf("shell through the model: state %v, error %v, reply %q", reply["state"], reply["error"], got)
	}
	for _, key := range []string{anthropicKey, fakeKey} {
		if strings.Contains(got, key) {
			t.Errorf("a provider key reached the shell tool's environment: %q", got)
		}
	}
	if calls := s.runRecord(t, reply).ToolCalls.Text; !strings.Contains(calls, `"name":"shell"`) {
		t.Errorf("run record tool_calls = %s, want the shell call", calls)
	}

	claude.mu.Lock()
	if len(claude.bad) > 0 {
		t.Errorf("the fake Anthropic server refused malformed requests: %q", claude.bad)
	}
	for _, c := range claude.calls {
		// anthropic-sdk-go v2.15 sends the key of option.WithAPIKey as
		// "Authorization: Bearer", and no X-Api-Key.
		if c.auth != "Bearer "+anthropicKey || c.apiKey != "" || c.version == "" {
			t.Errorf("the fake server got Authorization %q, X-Api-Key %q, anthropic-version %q; want the key from E2E_ANTHROPIC_KEY as a bearer token", c.auth, c.apiKey, c.version)
		}
	}
	if len(claude.calls) != 6 {
		t.Errorf("the fake Anthropic server got %d requests, want 6 (one per message, two for the tool round)", len(claude.calls))
	}
	claude.mu.Unlock()
	gpt.mu.Lock()
	if len(gpt.auths) != 0 {
		t.Errorf("the fallback was called %d times while the primary was healthy", len(gpt.auths))
	}
	gpt.mu.Unlock()

	s.noKeyInRuns(t, anthropicKey, fakeKey)
}

func TestAnOverloadedAnthropicPrimaryFallsBackToOpenAIAfterItsRetries(t *testing.T) {
	t.Parallel()
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithAnthropic(t, claude, gpt)

	reply := s.ask(t, "busy", "", "hello")
	// The fake OpenAI server's way of answering: the fallback wrote the reply.
	if reply["state"] != "succeeded" || text(reply) != `"hello" after 0 earlier messages` {
		t.Fatalf("state %v, reply %q, error %v; want the fallback's answer", reply["state"], text(reply), reply["error"])
	}

	// 529 is retried: 3 calls in all, 1 s then 2 s apart (no Retry-After),
	// and only then the fallback.
	calls := claude.callsFor(busyModel)
	if len(calls) != 3 {
		t.Fatalf("the overloaded primary got %d calls, want 3", len(calls))
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		if gap := calls[i+1].at.Sub(calls[i].at); gap < want || gap > want+time.Second {
			t.Errorf("retry %d came %v after the call before, want about %v", i+1, gap, want)
		}
	}
	gpt.mu.Lock()
	if len(gpt.auths) != 1 || gpt.auths[0] != "Bearer "+fakeKey {
		t.Errorf("the fallback got Authorization %q, want one call with the key from E2E_FAKE_KEY", gpt.auths)
	}
	gpt.mu.Unlock()

	// The run record's log tail tells the admin what happened.
	logTail := s.runRecord(t, reply).StderrTail.Text
	for _, want := range []string{"provider call failed; retrying", "provider failed; falling back", `"next":"gpt"`, "HTTP 529: Overloaded"} {
		if !strings.Contains(logTail, want) {
			t.Errorf("stderr_tail lacks %q:\n%s", want, logTail)
		}
	}
	if n := strings.Count(logTail, "provider call failed; retrying"); n != 2 {
		t.Errorf("stderr_tail logs %d retries, want 2:\n%s", n, logTail)
	}
	s.noKeyInRuns(t, anthropicKey, fakeKey)
}
