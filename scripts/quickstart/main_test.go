package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

const (
	openAIKey    = "sk-quickstart-openai-secret"
	anthropicKey = "sk-ant-quickstart-secret"
)

func TestDemoProviderFollowsTheEnvironmentAndNeverWritesTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		env    map[string]string
		want   agentproto.Provider // Name, Kind, BaseURL, Model, Key as the scheduler resolves them
		remote bool
		keyEnv string // the variable the suite's environment carries, "" for none
	}{
		{
			name: "neither set: the offline local provider, no network",
			env:  map[string]string{},
			want: agentproto.Provider{Name: "local", Kind: "local"},
		},
		{
			name: "a model alone selects nothing",
			env:  map[string]string{"OPENAI_MODEL": "gpt-x", "ANTHROPIC_MODEL": "claude-x"},
			want: agentproto.Provider{Name: "local", Kind: "local"},
		},
		{
			name:   "OPENAI_BASE_URL only: a keyless compatible server with the default model",
			env:    map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"},
			want:   agentproto.Provider{Name: "openai", Kind: "openai", BaseURL: "http://127.0.0.1:11434/v1", Model: "gpt-4o-mini"},
			remote: true,
		},
		{
			name:   "OPENAI_API_KEY and OPENAI_MODEL: OpenAI itself with that model",
			env:    map[string]string{"OPENAI_API_KEY": openAIKey, "OPENAI_MODEL": "gpt-e2e"},
			want:   agentproto.Provider{Name: "openai", Kind: "openai", Model: "gpt-e2e", Key: openAIKey},
			remote: true,
			keyEnv: "OPENAI_API_KEY",
		},
		{
			name:   "ANTHROPIC_API_KEY only: Anthropic with the default model",
			env:    map[string]string{"ANTHROPIC_API_KEY": anthropicKey},
			want:   agentproto.Provider{Name: "anthropic", Kind: "anthropic", Model: "claude-haiku-4-5", Key: anthropicKey},
			remote: true,
			keyEnv: "ANTHROPIC_API_KEY",
		},
		{
			name: "all ANTHROPIC_ variables: base URL, key and model",
			env: map[string]string{"ANTHROPIC_API_KEY": anthropicKey, "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080",
				"ANTHROPIC_MODEL": "claude-e2e", "OPENAI_MODEL": "gpt-unused"},
			want:   agentproto.Provider{Name: "anthropic", Kind: "anthropic", BaseURL: "http://127.0.0.1:8080", Model: "claude-e2e", Key: anthropicKey},
			remote: true,
			keyEnv: "ANTHROPIC_API_KEY",
		},
		{
			name: "both set: OpenAI wins and the Anthropic key is not passed on",
			env: map[string]string{"OPENAI_API_KEY": openAIKey, "ANTHROPIC_API_KEY": anthropicKey,
				"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080", "ANTHROPIC_MODEL": "claude-e2e"},
			want:   agentproto.Provider{Name: "openai", Kind: "openai", Model: "gpt-4o-mini", Key: openAIKey},
			remote: true,
			keyEnv: "OPENAI_API_KEY",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			providers, remote, env := demoProvider(func(k string) string { return tc.env[k] })
			if remote != tc.remote {
				t.Errorf("remote = %v, want %v", remote, tc.remote)
			}
			cfg := demoConfig(providers, "", "00ff", "127.0.0.1:9", "nobody", "/usr/libexec/berth/berth-agent")
			for _, key := range []string{openAIKey, anthropicKey} {
				if strings.Contains(cfg, key) {
					t.Errorf("the key %q is in the generated config:\n%s", key, cfg)
				}
			}

			// The suite's services get env: the key the config names, nothing else.
			wantEnv := []string(nil)
			if tc.keyEnv != "" {
				wantEnv = []string{tc.keyEnv + "=" + tc.env[tc.keyEnv]}
			}
			if strings.Join(env, "\n") != strings.Join(wantEnv, "\n") {
				t.Errorf("env = %q, want %q", env, wantEnv)
			}

			// The scheduler reads the config as berth does and resolves the
			// demo agent's provider, its key from the suite's environment.
			path := filepath.Join(t.TempDir(), "berth.toml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := config.Load(path)
			if err != nil {
				t.Fatalf("the generated config does not load: %v\n%s", err, cfg)
			}
			agent, err := c.Agent("demo")
			if err != nil {
				t.Fatal(err)
			}
			suiteEnv := map[string]string{}
			for _, kv := range env {
				k, v, _ := strings.Cut(kv, "=")
				suiteEnv[k] = v
			}
			chain, err := c.ProviderChain(agent, func(k string) string { return suiteEnv[k] })
			if err != nil {
				t.Fatalf("ProviderChain: %v", err)
			}
			if len(chain) != 1 || chain[0] != tc.want {
				t.Errorf("provider chain = %+v, want [%+v]", chain, tc.want)
			}
			// A real provider is reached through the egress proxy, run
			// by an unprivileged user: the sandbox never gets a network.
			if agent.FileAccess.AllowNetwork {
				t.Error("the demo agent has a direct network")
			}
			if c.Scheduler.EgressUser != egressUser || c.Scheduler.EgressBinary != "/usr/libexec/berth/berth-egress" {
				t.Errorf("egress proxy %s as %q, want berth-egress beside berth-agent as %q", c.Scheduler.EgressBinary, c.Scheduler.EgressUser, egressUser)
			}
		})
	}
}
