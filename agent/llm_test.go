package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

// oaRequest is what a fake OpenAI server reads of a chat-completions call.
type oaRequest struct {
	Auth     string
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

func (r oaRequest) text(i int) string {
	var s string
	_ = json.Unmarshal(r.Messages[i].Content, &s)
	return s
}

func (r oaRequest) last() (role, text string) {
	i := len(r.Messages) - 1
	return r.Messages[i].Role, r.text(i)
}

func (r oaRequest) toolNames() []string {
	var names []string
	for _, t := range r.Tools {
		names = append(names, t.Function.Name)
	}
	return names
}

// fakeOpenAI answers POST /v1/chat/completions with what respond returns
// (status, JSON body) and records every request.
type fakeOpenAI struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []oaRequest
}

func newFakeOpenAI(t *testing.T, respond func(oaRequest) (int, string)) *fakeOpenAI {
	t.Helper()
	f := &fakeOpenAI{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		var req oaRequest
		if err := json.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req.Auth = r.Header.Get("Authorization")
		f.mu.Lock()
		f.reqs = append(f.reqs, req)
		f.mu.Unlock()
		status, body := respond(req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOpenAI) requests() []oaRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func oaText(text string) (int, string) {
	return 200, fmt.Sprintf(`{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, text)
}

func oaCall(id, name string, args any) (int, string) {
	a, _ := json.Marshal(args)
	return 200, fmt.Sprintf(`{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, id, name, string(a))
}

const providerKey = "sk-provider-key-do-not-leak"

// openAIRequest is f.request with an OpenAI provider at srv and network on.
func (f fixture) openAIRequest(srv *fakeOpenAI, text string) agentproto.Request {
	req := f.request(text)
	req.Provider = agentproto.Provider{Name: "fake", Kind: "openai", BaseURL: srv.srv.URL + "/v1", Model: "gpt-test", Key: providerKey}
	req.Policy.Network = true
	return req
}

func TestAnOpenAIModelRunsToolsInTheSandboxWithoutSeeingTheKey(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	model := newFakeOpenAI(t, func(r oaRequest) (int, string) {
		if role, out := r.last(); role == "tool" {
			return oaText("the tool said: " + out)
		}
		return oaCall("call_1", "shell", map[string]string{"command": "env; tr '\\0' '\\n' < /proc/self/environ"})
	})
	f := newFixture(t)
	res := runAgent(t, f.openAIRequest(model, "show me your environment"), "BERTH_LOG_LEVEL=debug")
	res.expect(t, agentproto.ExitOK, "the tool said: ", "TMPDIR="+f.workspace+"/.tmp")
	// runAgent fails the test when the key shows up in stdout (the tool
	// output is in the response) or in the stderr logs.
	reqs := model.requests()
	if len(reqs) != 2 || reqs[0].Auth != "Bearer "+providerKey {
		t.Fatalf("requests = %d, auth %q", len(reqs), reqs[0].Auth)
	}
	last := reqs[1].Messages[len(reqs[1].Messages)-1]
	if last.Role != "tool" || last.ToolCallID != "call_1" {
		t.Errorf("the tool result went back as %+v, want role tool answering call_1", last)
	}
	if res.resp.Usage.Iterations != 2 || res.resp.Usage.InputTokens != 6 || len(res.resp.ToolCalls) != 1 {
		t.Errorf("usage %+v, tool calls %d", res.resp.Usage, len(res.resp.ToolCalls))
	}
}

func TestMaxIterationsEndsARealModelsLoop(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	model := newFakeOpenAI(t, func(oaRequest) (int, string) { return oaCall("call_x", "list_dir", map[string]string{}) })
	f := newFixture(t)
	req := f.openAIRequest(model, "loop forever")
	req.Agent.MaxIterations = 3
	res := runAgent(t, req)
	res.expect(t, agentproto.ExitAgentError, "I stopped after 3 steps")
	if res.resp.Error != "max iterations (3) reached" || len(model.requests()) != 3 {
		t.Errorf("error %q after %d calls", res.resp.Error, len(model.requests()))
	}
}

func TestAProviderEchoingTheKeyDoesNotPutItInLogs(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	model := newFakeOpenAI(t, func(oaRequest) (int, string) {
		return 401, fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s","type":"invalid_request_error","code":"invalid_api_key"}}`, providerKey)
	})
	f := newFixture(t)
	res := runAgent(t, f.openAIRequest(model, "hi"), "BERTH_LOG_LEVEL=debug")
	res.expect(t, agentproto.ExitAgentError)
	if !strings.Contains(res.resp.Error, "HTTP 401") || !strings.Contains(res.resp.Error, "[redacted]") {
		t.Errorf("error = %q, want the 401 with the key redacted", res.resp.Error)
	}
}

func TestSkillsJoinThePromptAndRestrictTools(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	model := newFakeOpenAI(t, func(oaRequest) (int, string) { return oaText("ok") })
	f := newFixture(t)
	writeFile(t, filepath.Join(f.workspace, "skills", "deploy", "SKILL.md"),
		"---\nname: deploy\ndescription: How we ship\ntriggers: [deploy, \"roll back\"]\ntools: [read_file, list_dir]\n---\nAlways run the smoke tests first.\n")
	writeFile(t, filepath.Join(f.workspace, "skills", "haiku.md"), "---\ndescription: Answer in haiku\ntriggers:\n  - poem\n---\nWrite 5-7-5.\n")

	runAgent(t, f.openAIRequest(model, "Please DEPLOY the site")).expect(t, agentproto.ExitOK)
	runAgent(t, f.openAIRequest(model, "hello")).expect(t, agentproto.ExitOK)
	reqs := model.requests()
	active, idle := reqs[0], reqs[1]
	if sys := active.text(0); !strings.Contains(sys, "Always run the smoke tests first.") || !strings.Contains(sys, "- haiku: Answer in haiku") {
		t.Errorf("system prompt with the deploy skill active:\n%s", sys)
	}
	if got := active.toolNames(); !slices.Equal(got, []string{"read_file", "list_dir"}) {
		t.Errorf("tools while deploy is active = %v, want [read_file list_dir]", got)
	}
	if sys := idle.text(0); strings.Contains(sys, "smoke tests") || strings.Contains(sys, "5-7-5") {
		t.Errorf("an inactive skill's body joined the prompt:\n%s", sys)
	}
	if got := idle.toolNames(); len(got) < 10 || !slices.Contains(got, "shell") {
		t.Errorf("tools without an active skill = %v, want all of them", got)
	}
}

func TestMemoryPersistsAcrossRuns(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	model := newFakeOpenAI(t, func(r oaRequest) (int, string) {
		role, text := r.last()
		switch {
		case role == "tool":
			return oaText(text)
		case strings.HasPrefix(text, "remember "):
			return oaCall("c1", "memory_store", map[string]string{"content": strings.TrimPrefix(text, "remember "), "source": "chat"})
		default:
			return oaCall("c2", "memory_search", map[string]any{"query": text, "limit": 1})
		}
	})
	f := newFixture(t)
	runAgent(t, f.openAIRequest(model, "remember the backup server is nas-02")).expect(t, agentproto.ExitOK, "stored memory m")
	runAgent(t, f.openAIRequest(model, "remember lunch is at noon")).expect(t, agentproto.ExitOK)
	res := runAgent(t, f.openAIRequest(model, "which server holds backups?"))
	res.expect(t, agentproto.ExitOK, "nas-02")
	if strings.Contains(res.resp.Reply, "lunch") {
		t.Errorf("limit 1 returned more than the best match: %s", res.resp.Reply)
	}
	if _, err := os.Stat(filepath.Join(f.workspace, "memory.db")); err != nil {
		t.Errorf("memory.db: %v", err)
	}
}

func TestNetworkFalseLetsTheProviderPortThrough(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	model := newFakeOpenAI(t, func(oaRequest) (int, string) { return oaText("reached") })
	f := newFixture(t)
	req := f.openAIRequest(model, "hi")
	req.Policy.Network = false
	var port uint16
	fmt.Sscanf(model.srv.URL[strings.LastIndex(model.srv.URL, ":")+1:], "%d", &port)
	req.Policy.ConnectPorts = []uint16{port}
	runAgent(t, req).expect(t, agentproto.ExitOK, "reached")
}
