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

const fakeKey = "sk-e2e-fake-openai-key"

// fakeOpenAI speaks the chat-completions wire format on 127.0.0.1. It
// answers "run ..." with a shell tool call, a tool result with its output,
// and anything else with how many earlier messages it was given.
type fakeOpenAI struct {
	srv   *httptest.Server
	mu    sync.Mutex
	auths []string
}

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		f.mu.Unlock()
		last := req.Messages[len(req.Messages)-1]
		message := func(m string) string {
			return `{"id":"c","object":"chat.completion","created":1,"model":"gpt-e2e","choices":[{"index":0,"finish_reason":"stop","message":` + m + `}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case last.Role == "tool":
			text, _ := json.Marshal("tool said: " + last.Content)
			io.WriteString(w, message(`{"role":"assistant","content":`+string(text)+`}`))
		case strings.HasPrefix(last.Content, "run "):
			args, _ := json.Marshal(map[string]string{"command": strings.TrimPrefix(last.Content, "run ")})
			call, _ := json.Marshal(string(args))
			io.WriteString(w, message(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"shell","arguments":`+string(call)+`}}]}`))
		default:
			// messages = system, earlier turns, this message.
			text, _ := json.Marshal(fmt.Sprintf("%q after %d earlier messages", last.Content, len(req.Messages)-2))
			io.WriteString(w, message(`{"role":"assistant","content":`+string(text)+`}`))
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// startWithOpenAI runs the suite with the fake as primary provider: agent
// "online" may use the network, agent "offline" may not.
func startWithOpenAI(t *testing.T, model *fakeOpenAI) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "fake"

[providers.fake]
kind = "openai"
base_url = %q
api_key_env = "E2E_FAKE_KEY"
model = "gpt-e2e"

[[agents]]
id = "online"
max_iterations = 4
[agents.file_access]
allow_network = true

[[agents]]
id = "offline"

[intake]
default_agent = "online"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[bindings]]
connector = "hooks"
channel_id = "offline"
agent = "offline"

[scheduler]
default_timeout_seconds = 60
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, model.srv.URL+"/v1", secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	return launchShort(t, sink, cfg, []string{"E2E_FAKE_KEY=" + fakeKey}, fakeKey)
}

func TestAConfinedAgentTalksToAnOpenAIServerAndFollowsTheThread(t *testing.T) {
	model := newFakeOpenAI(t)
	s := startWithOpenAI(t, model)
	post := func(channel, thread, text string) map[string]any {
		t.Helper()
		status, id := s.post(t, map[string]string{"channel": channel, "thread": thread, "author": "tester", "text": text})
		if status != http.StatusAccepted {
			t.Fatalf("POST %q: status %d", text, status)
		}
		return s.sink.wait(t, 60*time.Second, id)[id]
	}

	for i, want := range []string{`"first" after 0 earlier messages`, `"second" after 2 earlier messages`, `"third" after 4 earlier messages`} {
		reply := post("general", "T1", []string{"first", "second", "third"}[i])
		if reply["state"] != "succeeded" || text(reply) != want {
			t.Fatalf("message %d: state %v, reply %q, error %v; want %q", i+1, reply["state"], text(reply), reply["error"], want)
		}
	}
	if reply := post("general", "T2", "elsewhere"); text(reply) != `"elsewhere" after 0 earlier messages` {
		t.Errorf("another thread saw history: %q", text(reply))
	}

	reply := post("general", "T3", "run echo $((6*7)); env; echo uid=$(id -u)")
	if _, ok := agentUIDAfter(text(reply), "uid="); reply["state"] != "succeeded" || !strings.Contains(text(reply), `42\n`) || !ok {
		t.Errorf("shell through the model: state %v, reply %q", reply["state"], text(reply))
	}
	if strings.Contains(text(reply), fakeKey) {
		t.Errorf("the key reached the shell tool's environment: %q", text(reply))
	}

	// Without a network of its own the agent reaches the same server
	// through its run's egress proxy, which adds the key (e2e/egress_test.go
	// goes further; services/scheduler tests the refusal when no proxy can
	// be started).
	reply = post("offline", "", "hello")
	if reply["state"] != "succeeded" || text(reply) != `"hello" after 0 earlier messages` {
		t.Errorf("agent without network: state %v, reply %q, error %v; want the reply through the egress proxy", reply["state"], text(reply), reply["error"])
	}

	model.mu.Lock()
	for _, auth := range model.auths {
		if auth != "Bearer "+fakeKey {
			t.Errorf("the fake server got Authorization %q, want the key from E2E_FAKE_KEY", auth)
		}
	}
	model.mu.Unlock()

	// Nothing an admin can read over D-Bus — replies, errors, tool calls, the
	// agent's log tail — carries the key.
	for _, summary := range s.listRuns(t, busapi.ListFilter{Limit: 100}) {
		r := s.getRun(t, summary.ID)
		for k, v := range r.Plain() {
			if strings.Contains(fmt.Sprint(v), fakeKey) {
				t.Errorf("run %s exposes the provider key in %s", r.ID, k)
			}
		}
	}
}
