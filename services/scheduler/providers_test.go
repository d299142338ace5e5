package scheduler

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/landlock"
)

var (
	berthAgentOnce sync.Once
	berthAgentPath string
	berthAgentErr  error
)

// berthAgent builds the real berth-agent into a directory every user can
// enter, so the landlock backend can run it as nobody.
func berthAgent(t *testing.T) string {
	t.Helper()
	berthAgentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-scheduler-berth-agent-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			berthAgentErr = err
			return
		}
		berthAgentPath, berthAgentErr = testenv.BuildStatic(dir, "berth-agent", "../../cmd/berth-agent")
	})
	if berthAgentErr != nil {
		t.Fatalf("cannot build berth-agent: %v", berthAgentErr)
	}
	return berthAgentPath
}

// recordingBackend runs each spec on a real backend and keeps the requests
// as the agent reads them, to see what entered the sandbox.
type recordingBackend struct {
	isolation.Backend
	mu       sync.Mutex
	requests []string
}

func (b *recordingBackend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	data, err := spec.Input() // what the agent reads on its stdin
	if err != nil {
		return isolation.Result{}, err
	}
	b.mu.Lock()
	b.requests = append(b.requests, string(data))
	b.mu.Unlock()
	return b.Backend.Run(ctx, spec)
}

// A provider check is a run of the real berth-agent through the agent's
// backend and egress proxy: the proxy adds the key, which never enters the
// sandbox, and each provider's verdict tells reachability, key and model
// apart; a key the scheduler lacks is said so without a run.
func TestProvidersAreCheckedByARunThroughItsEgressProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	t.Run("Landlock", func(t *testing.T) {
		t.Parallel()
		checkProvidersByARun(t, func(*config.Config, string) (string, isolation.Backend) { return landlock.Name, landlock.New() })
	})
	t.Run("Container", func(t *testing.T) {
		t.Parallel()
		cli := testdocker.Engine(t)
		checkProvidersByARun(t, func(cfg *config.Config, stateDir string) (string, isolation.Backend) {
			enabled := true
			for i := range cfg.Agents {
				cfg.Agents[i].ContainerMode = config.ContainerSettings{Enabled: &enabled, Network: "none"}
			}
			boxes, err := container.New(container.Options{Client: cli, Instance: stateDir, Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			return container.Name, boxes
		})
	})
}

// checkProvidersByARun checks six providers with the backend that
// withBackend sets up (and configures the agents for).
func checkProvidersByARun(t *testing.T, withBackend func(cfg *config.Config, stateDir string) (string, isolation.Backend)) {
	const goodKey, badKey = "sk-probe-good-SECRET-1", "sk-probe-bad-SECRET-2"
	var mu sync.Mutex
	var auths []string
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Header.Get("Authorization") != "Bearer "+goodKey:
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)
		case bytes.Contains(body, []byte(`"model":"missing"`)):
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"message":"The model missing does not exist","type":"invalid_request_error","code":"model_not_found"}}`)
		default:
			io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"OK"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	t.Cleanup(model.Close)
	_, proxyBin := egressBinaries(t)
	cfg := testConfig(1)
	openai := func(name, baseURL, model, keyEnv string) config.Provider {
		return config.Provider{Name: name, Kind: "openai", BaseURL: baseURL, Model: model, APIKeyEnv: keyEnv}
	}
	cfg.Providers = config.Providers{Primary: "good", Entries: map[string]config.Provider{
		"good":    openai("good", model.URL+"/v1", "m", "GOOD_KEY"),
		"badkey":  openai("badkey", model.URL+"/v1", "m", "BAD_KEY"),
		"nomodel": openai("nomodel", model.URL+"/v1", "missing", "GOOD_KEY"),
		"down":    openai("down", "http://127.0.0.1:1/v1", "m", ""),
		"noenv":   openai("noenv", model.URL+"/v1", "m", "UNSET_KEY"),
		"offline": {Name: "offline", Kind: "local"},
	}}
	cfg.Scheduler.AgentBinary = berthAgent(t)
	cfg.Scheduler.EgressBinary = proxyBin
	cfg.Scheduler.EgressUser = "daemon"
	stateDir := sharedStateDir(t)
	name, real := withBackend(cfg, stateDir)
	backend := &recordingBackend{Backend: real}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{name: backend},
		Getenv:   func(k string) string { return map[string]string{"GOOD_KEY": goodKey, "BAD_KEY": badKey}[k] },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	rows, err := s.TestProviders("")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range rows {
		name, status, detail := r.Name, r.Status, r.Detail
		got[name] = status + ": " + detail
		if strings.Contains(detail, goodKey) || strings.Contains(detail, badKey) {
			t.Errorf("the result of %s holds a key: %q", name, detail)
		}
	}
	for name, want := range map[string]string{
		"good": "ok: OK", "badkey": "auth failed: ", "nomodel": "model not found: ", "down": "unreachable: ",
		"noenv": "error: UNSET_KEY is not set in the scheduler's environment", "offline": "ok: offline; nothing to reach",
	} {
		if !strings.HasPrefix(got[name], want) {
			t.Errorf("%s: %q, want %q…", name, got[name], want)
		}
	}
	backend.mu.Lock()
	requests := backend.requests
	backend.mu.Unlock()
	if len(requests) != 1 {
		t.Fatalf("%d runs were started, want one for the agent the remote providers stand for", len(requests))
	}
	if !strings.Contains(requests[0], `"probe":true`) || !strings.Contains(requests[0], `"proxied":true`) {
		t.Errorf("the check's request is not a probe through the egress proxy: %s", requests[0])
	}
	if strings.Contains(requests[0], goodKey) || strings.Contains(requests[0], badKey) {
		t.Errorf("a key entered the sandbox: %s", requests[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(auths, " "), "Bearer "+goodKey) {
		t.Errorf("the model never saw the key the proxy adds: %q", auths)
	}
	if _, err := os.Stat(filepath.Join(s.stateDir, "egress")); err == nil {
		if left, _ := os.ReadDir(filepath.Join(s.stateDir, "egress")); len(left) > 0 {
			t.Errorf("the check's egress directories outlived it: %v", left)
		}
	}
}
