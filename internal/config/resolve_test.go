package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

func load(t *testing.T, text string) *config.Config {
	t.Helper()
	c, err := config.Load(writeConfig(t, map[string]string{"berth.toml": text}))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestAgentResolvesAgentThenDefaultsThenBuiltIns(t *testing.T) {
	t.Parallel()
	c := load(t, `
[providers]
primary = "openai"
[providers.openai]
api_key_env = "OPENAI_API_KEY"

[agent_defaults]
model = "default-model"
max_iterations = 30
[agent_defaults.tools]
allow = ["read", "shell"]
deny = ["rm"]
[agent_defaults.container_mode]
image = "berth/base"
timeout_seconds = 90
[agent_defaults.file_access]
allow_read = ["/usr/share/doc"]

[[agents]]
id = "bare"

[[agents]]
id = "tuned"
name = "Tuned"
provider = "local"
max_iterations = 3
[agents.tools]
allow = []
[agents.container_mode]
enabled = true
memory_limit = "2g"
network = "none"
timeout_seconds = 15
[agents.file_access]
allow_read = ["/srv"]
allow_network = true

[[agents]]
id = "free"
[agents.file_access]
unrestricted = true

[scheduler]
default_timeout_seconds = 200
`)
	tests := []struct {
		name string
		id   string
		want config.Agent
	}{
		{
			name: "An agent that sets nothing takes the defaults and then the built-ins",
			id:   "bare",
			want: config.Agent{
				ID: "bare", Name: "bare", Provider: "openai", Model: "default-model", MaxIterations: 30,
				Tools:          config.ToolsSettings{Allow: []string{"read", "shell"}, Deny: []string{"rm"}},
				Container:      config.Container{Image: "berth/base", MemoryLimit: 512 << 20, Network: "bridge"},
				FileAccess:     config.FileAccess{AllowRead: []string{"/usr/share/doc"}},
				Isolation:      "landlock",
				WorkspaceQuota: 1 << 30,
				Sandbox:        builtInSandbox,
				// approval_timeout's default, though no ask rule uses it.
				EgressApprovalTimeout: 10 * time.Minute,
				Timeout:               90 * time.Second,
				Image:                 config.ImageConfig{BaseImage: "berth-base:bookworm"},
			},
		},
		{
			name: "An agent's own settings win, and its empty list replaces the defaults' list",
			id:   "tuned",
			want: config.Agent{
				ID: "tuned", Name: "Tuned", Provider: "local", Model: "default-model", MaxIterations: 3,
				Tools:          config.ToolsSettings{Allow: []string{}, Deny: []string{"rm"}},
				Container:      config.Container{Enabled: true, Image: "berth/base", MemoryLimit: 2 << 30, Network: "none"},
				FileAccess:     config.FileAccess{AllowRead: []string{"/srv"}, AllowNetwork: true},
				Isolation:      "container",
				WorkspaceQuota: 1 << 30,
				Sandbox:        builtInSandbox,
				// approval_timeout's default, though no ask rule uses it.
				EgressApprovalTimeout: 10 * time.Minute,
				Timeout:               15 * time.Second,
				Image:                 config.ImageConfig{BaseImage: "berth-base:bookworm"},
			},
		},
		{
			name: "An unrestricted agent without container mode runs unrestricted",
			id:   "free",
			want: config.Agent{
				ID: "free", Name: "free", Provider: "openai", Model: "default-model", MaxIterations: 30,
				Tools:          config.ToolsSettings{Allow: []string{"read", "shell"}, Deny: []string{"rm"}},
				Container:      config.Container{Image: "berth/base", MemoryLimit: 512 << 20, Network: "bridge"},
				FileAccess:     config.FileAccess{Unrestricted: true, AllowRead: []string{"/usr/share/doc"}},
				Isolation:      "unrestricted",
				WorkspaceQuota: 1 << 30,
				Sandbox:        builtInSandbox,
				// approval_timeout's default, though no ask rule uses it.
				EgressApprovalTimeout: 10 * time.Minute,
				Timeout:               90 * time.Second,
				Image:                 config.ImageConfig{BaseImage: "berth-base:bookworm"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Agent(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Agent(%q) =\n%+v\nwant\n%+v", tc.id, got, tc.want)
			}
		})
	}
}

func TestAgentWithoutAnySettingsUsesBuiltInDefaults(t *testing.T) {
	t.Parallel()
	c := load(t, "[[agents]]\nid = \"a\"\n")

	got, err := c.Agent("a")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Agent{
		ID: "a", Name: "a", Provider: "local", MaxIterations: 10,
		Container: config.Container{MemoryLimit: 512 << 20, Network: "bridge"},
		Isolation: "landlock", Timeout: 300 * time.Second, WorkspaceQuota: 1 << 30,
		Sandbox: builtInSandbox,
		Image:   config.ImageConfig{BaseImage: "berth-base:bookworm"},
		// approval_timeout's default, though no ask rule uses it.
		EgressApprovalTimeout: 10 * time.Minute,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Agent = %+v, want %+v", got, want)
	}
}

func TestAgentFailsForAnUnknownIDListingTheKnownOnes(t *testing.T) {
	t.Parallel()
	c := load(t, "[[agents]]\nid = \"a\"\n[[agents]]\nid = \"b\"\n")

	_, err := c.Agent("zed")
	if err == nil || !strings.Contains(err.Error(), `"zed"`) || !strings.Contains(err.Error(), "a, b") {
		t.Errorf("Agent(zed) error = %v, want one naming zed and listing a, b", err)
	}
}

func TestRoute(t *testing.T) {
	t.Parallel()
	c := load(t, `
[[agents]]
id = "general"
[[agents]]
id = "dev"
[[agents]]
id = "ops"
[[agents]]
id = "exact"
[[agents]]
id = "other"
[[agents]]
id = "hookdefault"

[intake]
default_agent = "general"

[[connectors]]
id = "hook"
type = "webhook"
secret = "s"
default_agent = "hookdefault"

[[connectors]]
id = "plain"
type = "webhook"
secret = "s"

[[bindings]]
channel_name = "dev-*"
agent = "dev"

[[bindings]]
connector = "plain"
channel_name = "ops-*"
agent = "ops"

[[bindings]]
connector = "hook"
channel_id = "C42"
agent = "exact"

[[bindings]]
connector = "plain"
channel_id = "C42"
agent = "other"
`)
	tests := []struct {
		name                              string
		connector, channelID, channelName string
		want                              string
	}{
		{"An exact channel id wins over an earlier matching glob", "hook", "C42", "dev-backend", "exact"},
		{"A channel id binding for another connector does not match", "plain", "C42", "x", "other"},
		{"A glob binding without connector matches every connector", "plain", "C1", "dev-frontend", "dev"},
		{"A glob binding for another connector does not match", "hook", "C1", "ops-alerts", "hookdefault"},
		{"A glob binding for this connector matches", "plain", "C1", "ops-alerts", "ops"},
		{"Without a binding the connector's default agent is used", "hook", "C7", "random", "hookdefault"},
		{"Without a connector default the intake default agent is used", "plain", "C7", "random", "general"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Route(tc.connector, tc.channelID, tc.channelName)
			if err != nil || got != tc.want {
				t.Errorf("Route(%q, %q, %q) = %q, %v; want %q", tc.connector, tc.channelID, tc.channelName, got, err, tc.want)
			}
		})
	}
}

func TestRouteFailsWhenNothingMatchesAndNoDefaultIsSet(t *testing.T) {
	t.Parallel()
	c := load(t, "[[agents]]\nid = \"a\"\n[[bindings]]\nchannel_id = \"C1\"\nagent = \"a\"\n")

	if got, err := c.Route("hook", "C2", "general"); err == nil {
		t.Errorf("Route = %q, want an error", got)
	}
}

func TestRouteMessageOrdersChannelIDThenNameThenServerThenDefaults(t *testing.T) {
	t.Parallel()
	c := load(t, `
[[agents]]
id = "general"
[[agents]]
id = "by-id"
[[agents]]
id = "by-name"
[[agents]]
id = "by-server"
[[agents]]
id = "ops-in-g2"
[[agents]]
id = "dc-default"

[intake]
default_agent = "general"

[[connectors]]
id = "dc"
type = "discord"
token = "$DISCORD_TOKEN"
default_agent = "dc-default"

[[connectors]]
id = "chat"
type = "meepachat"
base_url = "https://chat.example.org"
token = "$MEEPA_TOKEN"

[[bindings]]
connector = "dc"
server_id = "G1"
agent = "by-server"

[[bindings]]
connector = "dc"
channel_name = "dev-*"
agent = "by-name"

[[bindings]]
server_id = "G2"
channel_name = "ops-*"
agent = "ops-in-g2"

[[bindings]]
channel_id = "C42"
agent = "by-id"
`)
	tests := []struct {
		name                                        string
		connector, channelID, channelName, serverID string
		want                                        string
	}{
		{"An exact channel id wins over a matching name and server", "dc", "C42", "dev-x", "G1", "by-id"},
		{"A channel name glob wins over a server binding listed before it", "dc", "C1", "dev-x", "G1", "by-name"},
		{"A server binding routes every other channel of that server", "dc", "C1", "random", "G1", "by-server"},
		{"A server binding does not route another server's channels", "dc", "C1", "random", "G9", "dc-default"},
		{"A server binding does not route direct messages, which have no server", "dc", "D1", "", "", "dc-default"},
		{"A server binding for another connector does not match", "chat", "C1", "random", "G1", "general"},
		{"A name binding narrowed to a server matches in that server", "chat", "C1", "ops-alerts", "G2", "ops-in-g2"},
		{"A name binding narrowed to a server does not match in another", "chat", "C1", "ops-alerts", "G1", "general"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.RouteMessage(tc.connector, tc.channelID, tc.channelName, tc.serverID)
			if err != nil || got != tc.want {
				t.Errorf("RouteMessage(%q, %q, %q, %q) = %q, %v; want %q", tc.connector, tc.channelID, tc.channelName, tc.serverID, got, err, tc.want)
			}
		})
	}
}

func TestRouteMessageErrorNamesTheServer(t *testing.T) {
	t.Parallel()
	c := load(t, "[[agents]]\nid = \"a\"\n[[bindings]]\nserver_id = \"G1\"\nagent = \"a\"\n")

	_, err := c.RouteMessage("dc", "C2", "general", "G2")
	if err == nil || !strings.Contains(err.Error(), `of server "G2" of connector "dc"`) {
		t.Errorf("RouteMessage = %v, want an error naming server G2 and connector dc", err)
	}
}

const chainConfig = `
[providers]
primary = "openai"
fallback = ["anthropic", "openai", "local"]

[providers.openai]
api_key_env = "OPENAI_API_KEY"
model = "gpt-4o"

[providers.anthropic]
api_key_env = "ANTHROPIC_API_KEY"
model = "claude"
max_tokens = 1000

[[agents]]
id = "coder"
model = "gpt-5"
`

func TestProviderChain(t *testing.T) {
	t.Parallel()
	c := load(t, chainConfig)
	a, err := c.Agent("coder")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    []agentproto.Provider
		wantErr string
	}{
		{
			name: "The agent's provider comes first with its model, then each fallback once",
			env:  map[string]string{"OPENAI_API_KEY": "sk-open", "ANTHROPIC_API_KEY": "sk-anth"},
			want: []agentproto.Provider{
				{Name: "openai", Kind: "openai", Model: "gpt-5", Key: "sk-open"},
				{Name: "anthropic", Kind: "anthropic", Model: "claude", MaxTokens: 1000, Key: "sk-anth"},
				{Name: "local", Kind: "local"},
			},
		},
		{
			name:    "A missing key is an error naming the variable",
			env:     map[string]string{"OPENAI_API_KEY": "sk-open"},
			wantErr: "ANTHROPIC_API_KEY",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.ProviderChain(a, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "sk-open") {
					t.Fatalf("ProviderChain error = %v, want one naming %s and no key", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ProviderChain =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestConnectorSecretReadsTheSecretFileWithoutItsNewline(t *testing.T) {
	t.Parallel()
	secretFile := filepath.Join(t.TempDir(), "hook.secret")
	if err := os.WriteFile(secretFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := load(t, `
[[connectors]]
id = "filed"
type = "webhook"
secret_file = "`+secretFile+`"

[[connectors]]
id = "inline"
type = "webhook"
secret = "inline-secret"
`)
	for id, want := range map[string]string{"filed": "from-file", "inline": "inline-secret"} {
		got, err := c.ConnectorSecret(id)
		if err != nil || string(got) != want {
			t.Errorf("ConnectorSecret(%q) = %q, %v; want %q", id, got, err, want)
		}
	}
	if _, err := c.ConnectorSecret("nope"); err == nil {
		t.Error("ConnectorSecret(nope) succeeded, want an error")
	}
}

func TestWriteCheck(t *testing.T) {
	t.Parallel()
	valid := writeConfig(t, map[string]string{
		"berth.toml":           validConfig,
		"berth.d/10-more.toml": "[[connectors]]\nid = \"second\"\ntype = \"webhook\"\nsecret = \"second-secret\"\ndefault_agent = \"ops\"\n",
	})
	invalid := writeConfig(t, map[string]string{
		"berth.toml": validConfig + "\n[[agents]]\nid = \"BAD\"\nbogus = 1\n",
	})
	tests := []struct {
		name        string
		path, agent string
		wantErr     bool
		want        []string
	}{
		{
			name: "A valid configuration gets a one-line summary",
			path: valid,
			want: []string{"configuration ok: 2 files (", "2 agents (coder, ops), 2 connectors (hook, second)"},
		},
		{
			name: "An agent's effective settings show key variable names and hide secrets",
			path: valid, agent: "ops",
			want: []string{
				"[agents.ops]", `isolation = "landlock"`, `allow_read = ["/etc"]`, "max_iterations = 20",
				`api_key_env = "OPENAI_API_KEY"`, `api_key_env = "ANTHROPIC_API_KEY"`,
				"[connectors.second]", `secret = "(set)"`, "[connectors.hook]",
			},
		},
		{
			name: "An unknown agent is an error",
			path: valid, agent: "nobody", wantErr: true,
			want: []string{`unknown agent "nobody"`},
		},
		{
			name: "An invalid configuration prints every error",
			path: invalid, wantErr: true,
			want: []string{
				`berth.toml:73: agents[2].id: "BAD" is not a valid id`,
				"berth.toml:74: agents[2].bogus: unknown key",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := config.WriteCheck(&out, tc.path, tc.agent)
			if (err != nil) != tc.wantErr {
				t.Fatalf("WriteCheck error = %v, want error: %v\n%s", err, tc.wantErr, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
			for _, secret := range []string{"hook-secret", "second-secret"} {
				if strings.Contains(out.String(), secret) {
					t.Errorf("output reveals the secret %q:\n%s", secret, out.String())
				}
			}
		})
	}
}
