package config_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

// writeConfig writes files (paths relative to a fresh directory, the main
// file being "berth.toml") and returns the main file's path.
func writeConfig(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "berth.toml")
}

// errorLines returns each error of a load, with the test directory removed
// from file names.
func errorLines(t *testing.T, err error, mainPath string) []string {
	t.Helper()
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load error is %T (%v), want config.Errors", err, err)
	}
	lines := strings.Split(errs.Error(), "\n")
	for i := range lines {
		lines[i] = strings.TrimPrefix(lines[i], filepath.Dir(mainPath)+"/")
	}
	return lines
}

func ptr[T any](v T) *T { return &v }

const validConfig = `
[providers]
primary = "openai"
fallback = ["anthropic", "local"]

[providers.openai]
api_key_env = "OPENAI_API_KEY"
model = "gpt-4o"
base_url = "https://llm.internal/v1"
max_tokens = 4096

[providers.anthropic]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
model = "claude-sonnet"

[agent_defaults]
max_iterations = 20
[agent_defaults.tools]
deny = ["shell"]
[agent_defaults.container_mode]
image = "berth/base:1"

[[agents]]
id = "coder"
name = "Coder"
workspace = "/srv/coder"
provider = "anthropic"
model = "claude-opus"
max_iterations = 50
[agents.tools]
allow = ["read", "write"]
deny = []
[agents.container_mode]
enabled = true
memory_limit = "1g"
timeout_seconds = 600
network = "none"

[[agents]]
id = "ops"
file_access = { allow_read = ["/etc"], allow_read_write = ["/srv/ops"], deny = ["/etc/shadow"], allow_home_dotfiles = true, allow_network = true }

[intake]
listen = "127.0.0.1:8080"
default_agent = "ops"

[[connectors]]
id = "hook"
type = "webhook"
secret = "hook-secret"
reply_url = "https://chat.example/reply"
default_agent = "coder"

[[bindings]]
connector = "hook"
channel_id = "C1"
agent = "ops"

[scheduler]
max_concurrent_runs = 8
default_timeout_seconds = 120
run_as = "berth-runner"
agent_binary = "/opt/berth/berth-agent"

[retention]
finished_runs_days = 7
runs_per_agent = 500
delivered_hours = 48
idle_conversation_days = 14
`

func TestLoadReadsEveryKeyOfAValidConfig(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": validConfig})

	got, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &config.Config{
		Providers: config.Providers{
			Primary:  "openai",
			Fallback: []string{"anthropic", "local"},
			Entries: map[string]config.Provider{
				"openai":    {Name: "openai", Kind: "openai", APIKeyEnv: "OPENAI_API_KEY", Model: "gpt-4o", BaseURL: "https://llm.internal/v1", MaxTokens: 4096},
				"anthropic": {Name: "anthropic", Kind: "anthropic", APIKeyEnv: "ANTHROPIC_API_KEY", Model: "claude-sonnet"},
				"local":     {Name: "local", Kind: "local"},
			},
		},
		AgentDefaults: config.AgentSettings{
			MaxIterations: ptr(20),
			Tools:         config.ToolsSettings{Deny: []string{"shell"}},
			ContainerMode: config.ContainerSettings{Image: "berth/base:1"},
		},
		Agents: []config.AgentSettings{
			{
				ID: "coder", Name: "Coder", Workspace: "/srv/coder", Provider: "anthropic", Model: "claude-opus",
				MaxIterations: ptr(50),
				Tools:         config.ToolsSettings{Allow: []string{"read", "write"}, Deny: []string{}},
				ContainerMode: config.ContainerSettings{Enabled: ptr(true), MemoryLimit: ptr(config.Bytes(1 << 30)), TimeoutSeconds: ptr(600), Network: "none"},
			},
			{
				ID: "ops",
				FileAccess: config.FileAccessSettings{
					AllowRead: []string{"/etc"}, AllowReadWrite: []string{"/srv/ops"}, Deny: []string{"/etc/shadow"},
					AllowHomeDotfiles: ptr(true), AllowNetwork: ptr(true),
				},
			},
		},
		Intake:     config.Intake{Listen: "127.0.0.1:8080", DefaultAgent: "ops"},
		Connectors: []config.Connector{{ID: "hook", Type: "webhook", Secret: "hook-secret", ReplyURL: "https://chat.example/reply", DefaultAgent: "coder"}},
		Bindings:   []config.Binding{{Connector: "hook", ChannelID: "C1", Agent: "ops"}},
		Scheduler: config.Scheduler{MaxConcurrentRuns: 8, DefaultTimeout: 120 * time.Second, RunAs: "berth-runner", AgentBinary: "/opt/berth/berth-agent", EgressBinary: "/opt/berth/berth-egress", EgressUser: "berth-egress", AgentUIDs: config.DefaultAgentUIDs, RunsCPUWeight: config.DefaultRunsCPUWeight,
			MaxReplyFileBytes: config.DefaultMaxReplyFileBytes, MaxReplyFilesBytes: config.DefaultMaxReplyFilesBytes},
		Retention: config.Retention{FinishedRuns: 7 * 24 * time.Hour, RunsPerAgent: 500, Delivered: 48 * time.Hour, IdleConversation: 14 * 24 * time.Hour},
		Sources:   []string{path},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load returned\n%+v\nwant\n%+v", got, want)
	}
}

func TestLoadFillsSchedulerDefaultsAndTheLocalProvider(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": "[[agents]]\nid = \"a\"\n"})

	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := config.Scheduler{MaxConcurrentRuns: 4, DefaultTimeout: 300 * time.Second, RunAs: "berth-agent", AgentBinary: "/usr/libexec/berth/berth-agent", EgressBinary: "/usr/libexec/berth/berth-egress", EgressUser: "berth-egress", AgentUIDs: config.DefaultAgentUIDs, RunsCPUWeight: config.DefaultRunsCPUWeight,
		MaxReplyFileBytes: config.DefaultMaxReplyFileBytes, MaxReplyFilesBytes: config.DefaultMaxReplyFilesBytes}
	if c.Scheduler != want {
		t.Errorf("Scheduler = %+v, want %+v", c.Scheduler, want)
	}
	if p := c.Providers.Entries["local"]; p.Kind != "local" {
		t.Errorf("provider local = %+v, want kind local", p)
	}
}

func TestLoadAppliesDropIns(t *testing.T) {
	t.Parallel()
	main := `
[providers.openai]
api_key_env = "OPENAI_API_KEY"
model = "gpt-4o"

[[agents]]
id = "coder"
name = "Coder"
max_iterations = 5
[agents.tools]
allow = ["read"]

[[agents]]
id = "ops"

[[connectors]]
id = "hook"
type = "webhook"
secret = "one"
default_agent = "coder"

[[bindings]]
channel_id = "C1"
agent = "coder"

[scheduler]
max_concurrent_runs = 2
run_as = "alice"
`
	tests := []struct {
		name    string
		dropIns map[string]string
		check   func(t *testing.T, c *config.Config)
	}{
		{
			name:    "A scalar set in a drop-in overrides the main file and keeps its siblings",
			dropIns: map[string]string{"berth.d/10-sched.toml": "[scheduler]\nmax_concurrent_runs = 9\n"},
			check: func(t *testing.T, c *config.Config) {
				if c.Scheduler.MaxConcurrentRuns != 9 || c.Scheduler.RunAs != "alice" {
					t.Errorf("Scheduler = %+v, want 9 runs as alice", c.Scheduler)
				}
			},
		},
		{
			name:    "An agent with a known id is merged field by field",
			dropIns: map[string]string{"berth.d/10-coder.toml": "[[agents]]\nid = \"coder\"\nmax_iterations = 7\n[agents.container_mode]\nenabled = true\n"},
			check: func(t *testing.T, c *config.Config) {
				if got := c.AgentIDs(); !reflect.DeepEqual(got, []string{"coder", "ops"}) {
					t.Fatalf("AgentIDs = %v, want [coder ops]", got)
				}
				a, err := c.Agent("coder")
				if err != nil {
					t.Fatal(err)
				}
				if a.Name != "Coder" || a.MaxIterations != 7 || !a.Container.Enabled || !reflect.DeepEqual(a.Tools.Allow, []string{"read"}) {
					t.Errorf("coder = %+v, want name Coder, 7 iterations, container enabled, allow [read]", a)
				}
			},
		},
		{
			name:    "An agent with a new id is appended",
			dropIns: map[string]string{"berth.d/10-new.toml": "[[agents]]\nid = \"writer\"\n"},
			check: func(t *testing.T, c *config.Config) {
				if got := c.AgentIDs(); !reflect.DeepEqual(got, []string{"coder", "ops", "writer"}) {
					t.Errorf("AgentIDs = %v, want [coder ops writer]", got)
				}
			},
		},
		{
			name:    "A connector with a known id is merged and bindings are appended",
			dropIns: map[string]string{"berth.d/10-hook.toml": "[[connectors]]\nid = \"hook\"\nsecret = \"two\"\n\n[[bindings]]\nchannel_id = \"C2\"\nagent = \"ops\"\n"},
			check: func(t *testing.T, c *config.Config) {
				k, ok := c.Connector("hook")
				if !ok || k.Secret != "two" || k.Type != "webhook" || k.DefaultAgent != "coder" || len(c.Connectors) != 1 {
					t.Errorf("connectors = %+v, want one hook with the new secret and its other fields kept", c.Connectors)
				}
				if len(c.Bindings) != 2 || c.Bindings[1].ChannelID != "C2" {
					t.Errorf("bindings = %+v, want C1 then C2", c.Bindings)
				}
			},
		},
		{
			name:    "A provider is merged by name",
			dropIns: map[string]string{"berth.d/10-p.toml": "[providers.openai]\nmodel = \"gpt-5\"\n"},
			check: func(t *testing.T, c *config.Config) {
				p := c.Providers.Entries["openai"]
				if p.Model != "gpt-5" || p.APIKeyEnv != "OPENAI_API_KEY" {
					t.Errorf("openai = %+v, want model gpt-5 and the key env kept", p)
				}
			},
		},
		{
			name: "Drop-ins apply in lexical order so the last name wins",
			dropIns: map[string]string{
				"berth.d/9-last.toml":   "[scheduler]\nmax_concurrent_runs = 30\n",
				"berth.d/10-first.toml": "[scheduler]\nmax_concurrent_runs = 10\n",
				"berth.d/20-mid.toml":   "[scheduler]\nmax_concurrent_runs = 20\n",
			},
			check: func(t *testing.T, c *config.Config) {
				if c.Scheduler.MaxConcurrentRuns != 30 {
					t.Errorf("MaxConcurrentRuns = %d, want 30 from 9-last.toml", c.Scheduler.MaxConcurrentRuns)
				}
				var names []string
				for _, s := range c.Sources {
					names = append(names, filepath.Base(s))
				}
				if want := []string{"berth.toml", "10-first.toml", "20-mid.toml", "9-last.toml"}; !reflect.DeepEqual(names, want) {
					t.Errorf("Sources = %v, want %v", names, want)
				}
			},
		},
		{
			name: "Files that are hidden or do not end in .toml are ignored",
			dropIns: map[string]string{
				"berth.d/.10-x.toml":    "[scheduler]\nmax_concurrent_runs = 30\n",
				"berth.d/10-x.toml.bak": "[scheduler]\nmax_concurrent_runs = 30\n",
			},
			check: func(t *testing.T, c *config.Config) {
				if c.Scheduler.MaxConcurrentRuns != 2 || len(c.Sources) != 1 {
					t.Errorf("MaxConcurrentRuns = %d from %v, want 2 from berth.toml alone", c.Scheduler.MaxConcurrentRuns, c.Sources)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := map[string]string{"berth.toml": main}
			for k, v := range tc.dropIns {
				files[k] = v
			}
			c, err := config.Load(writeConfig(t, files))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			tc.check(t, c)
		})
	}
}

func TestLoadFailsWhenTheMainFileIsMissing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "berth.toml")

	_, err := config.Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want an error naming %s that is fs.ErrNotExist", err, path)
	}
}

// replaceDir writes the test directory inside a message as TMP.
func replaceDir(s, mainPath string) string {
	return strings.ReplaceAll(s, filepath.Dir(mainPath), "TMP")
}

func join(lines []string) string { return strings.Join(lines, "\n") }

func TestThePackagedDefaultConfigLoadsWithTheBuiltInRetention(t *testing.T) {
	t.Parallel()
	c, err := config.Load(filepath.Join("..", "..", "packaging", "etc", "berth.toml"))
	if err != nil {
		t.Fatalf("Load of the packaged berth.toml: %v", err)
	}
	want := config.Retention{FinishedRuns: 30 * 24 * time.Hour, RunsPerAgent: 10000, Delivered: 72 * time.Hour, IdleConversation: 30 * 24 * time.Hour}
	if c.Retention != want {
		t.Errorf("Retention = %+v, want the built-in defaults %+v", c.Retention, want)
	}
}
