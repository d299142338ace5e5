package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

func TestEgressAllowRulesAreReadAndChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		toml    string
		want    []string
		wantErr string
	}{
		{
			name: "Rules are read from the agent",
			toml: "[[agents]]\nid = \"ops\"\n[agents.egress]\nallow = [\"pypi.org\", \"*.debian.org\", \"github.com:443\", \"GET,HEAD deb.example.org\"]\n",
			want: []string{"pypi.org", "*.debian.org", "github.com:443", "GET,HEAD deb.example.org"},
		},
		{
			name: "Agent defaults apply when the agent sets none",
			toml: "[agent_defaults.egress]\nallow = [\"pypi.org\"]\n[[agents]]\nid = \"ops\"\n",
			want: []string{"pypi.org"},
		},
		{
			name:    "A URL instead of a host is refused with file, line and key",
			toml:    "[[agents]]\nid = \"ops\"\n[agents.egress]\nallow = [\"pypi.org\", \"https://pypi.org/simple\"]\n",
			wantErr: `berth.toml:4: agents[0].egress.allow[1]: "https://pypi.org/simple": a rule names a host, not a URL`,
		},
		{
			name:    "A bad method is refused",
			toml:    "[[agents]]\nid = \"ops\"\n[agents.egress]\nallow = [\"FETCH pypi.org\"]\n",
			wantErr: `agents[0].egress.allow[0]: "FETCH pypi.org": "FETCH" is not an HTTP method`,
		},
		{
			name:    "A bad port is refused",
			toml:    "[[agents]]\nid = \"ops\"\n[agents.egress]\nallow = [\"pypi.org:99999\"]\n",
			wantErr: `port "99999" is not 1-65535`,
		},
		{
			name:    "MeepaGateway's inject_secrets_env points to egress secrets",
			toml:    "[[agents]]\nid = \"ops\"\ninject_secrets_env = [\"GITHUB_TOKEN\"]\n",
			wantErr: "berth.toml:3: agents[0].inject_secrets_env: berth never puts secrets into a sandbox's environment: bind the secret to its hosts in [[egress.secrets]]",
		},
		{
			name:    "MeepaGateway's inject_credentials_env under container_mode is refused too",
			toml:    "[[agents]]\nid = \"ops\"\n[agents.container_mode]\ninject_credentials_env = {GH = \"x\"}\n",
			wantErr: "agents[0].container_mode.inject_credentials_env: berth never puts secrets into a sandbox's environment: bind the secret to its hosts in [[egress.secrets]]",
		},
		{
			name:    "The egress proxy never runs as root",
			toml:    "[scheduler]\negress_user = \"root\"\n[[agents]]\nid = \"ops\"\n",
			wantErr: "berth.toml:2: scheduler.egress_user: must not be root",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tt.toml})
			cfg, err := config.Load(path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("loaded; want an error containing %q", tt.wantErr)
				}
				if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tt.wantErr) {
					t.Fatalf("errors = %s\nwant one containing %q", got, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, err := cfg.Agent("ops")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.EgressAllow, tt.want) {
				t.Fatalf("egress allow = %q, want %q", a.EgressAllow, tt.want)
			}
			if cfg.Scheduler.EgressUser != "berth-egress" || cfg.Scheduler.EgressBinary != "/usr/libexec/berth/berth-egress" {
				t.Fatalf("egress defaults = %q, %q", cfg.Scheduler.EgressUser, cfg.Scheduler.EgressBinary)
			}
		})
	}
}

func TestEgressSecretsAreReadAndChecked(t *testing.T) {
	t.Parallel()
	agent := "[[agents]]\nid = \"ops\"\n"
	tests := []struct {
		name    string
		toml    string
		want    []config.EgressSecret
		wantErr string
	}{
		{
			name: "A_secret_gets_the_bearer_default",
			toml: agent + "[[egress.secrets]]\nname = \"github\"\nenv = \"GITHUB_TOKEN\"\nhosts = [\"api.github.com\", \"github.com\"]\n",
			want: []config.EgressSecret{{Name: "github", Env: "GITHUB_TOKEN", Hosts: []string{"api.github.com", "github.com"}, Header: "Authorization", Format: "Bearer {}"}},
		},
		{
			name: "A_secret_from_a_file_with_its_own_header",
			toml: agent + "[[egress.secrets]]\nname = \"registry\"\nfile = \"registry.token\"\nhosts = [\"registry.example\"]\nheader = \"X-Token\"\nformat = \"{}\"\n",
			want: []config.EgressSecret{{Name: "registry", File: "registry.token", Hosts: []string{"registry.example"}, Header: "X-Token", Format: "{}"}},
		},
		{
			name:    "Both_env_and_file_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nfile = \"b\"\nhosts = [\"h.example\"]\n",
			wantErr: "egress.secrets[0]: set exactly one of env and file",
		},
		{
			name:    "A_glob_host_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"*.github.com\"]\n",
			wantErr: `egress.secrets[0].hosts[0]: "*.github.com" is not a host name (exact, no glob, no port)`,
		},
		{
			name:    "A_format_without_the_placeholder_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\nformat = \"Bearer\"\n",
			wantErr: `egress.secrets[0].format: "Bearer" must hold "{}" once`,
		},
		{
			name:    "A_secret_twice_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\n[[egress.secrets]]\nname = \"x\"\nenv = \"B\"\nhosts = [\"i.example\"]\n",
			wantErr: `secret "x" is already defined on line`,
		},
		{
			name: "A_secret_scoped_to_ports_methods_and_paths",
			toml: agent + "[[egress.secrets]]\nname = \"gh\"\nenv = \"A\"\nhosts = [\"api.github.com\"]\nports = [443]\nmethods = [\"GET\", \"POST\"]\npaths = [\"/repos/acme\"]\n",
			want: []config.EgressSecret{{Name: "gh", Env: "A", Hosts: []string{"api.github.com"}, Header: "Authorization", Format: "Bearer {}", Ports: []int{443}, Methods: []string{"GET", "POST"}, Paths: []string{"/repos/acme"}}},
		},
		{
			name:    "A_bad_port_is_refused_with_its_line",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\nports = [443, 70000]\n",
			wantErr: "berth.toml:7: egress.secrets[0].ports[1]: port 70000 is not 1-65535",
		},
		{
			name:    "CONNECT_is_not_a_method_inside_a_tunnel",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\nmethods = [\"CONNECT\"]\n",
			wantErr: `berth.toml:7: egress.secrets[0].methods[0]: "CONNECT" is not the method of a request inside a tunnel`,
		},
		{
			name:    "A_path_with_dot_segments_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\npaths = [\"/repos/../admin\"]\n",
			wantErr: `berth.toml:7: egress.secrets[0].paths[0]: "/repos/../admin" is not a path prefix`,
		},
		{
			name:    "A_glob_path_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\npaths = [\"/repos/*\"]\n",
			wantErr: `egress.secrets[0].paths[0]: "/repos/*" is not a path prefix`,
		},
		{
			name:    "An_unknown_key_is_refused",
			toml:    agent + "[[egress.secrets]]\nname = \"x\"\nenv = \"A\"\nhosts = [\"h.example\"]\nvalue = \"inline\"\n",
			wantErr: "egress.secrets[0].value: unknown key",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tt.toml})
			cfg, err := config.Load(path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("loaded; want an error containing %q", tt.wantErr)
				}
				if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tt.wantErr) {
					t.Fatalf("errors = %s\nwant one containing %q", got, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.EgressSecrets, tt.want) {
				t.Fatalf("secrets = %+v, want %+v", cfg.EgressSecrets, tt.want)
			}
		})
	}
}

func TestProviderEgressSettingsAreReadAndChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		toml    string
		want    config.Provider
		wantErr string
	}{
		{
			name: "OpenAI_scoping_and_endpoints_come_from_config",
			toml: "[providers.openai]\napi_key_env = \"K\"\nendpoints = [\"chat/completions\"]\norganization = \"org-1\"\nproject = \"proj_2\"\n",
			want: config.Provider{Name: "openai", Kind: "openai", APIKeyEnv: "K", Endpoints: []string{"chat/completions"}, Organization: "org-1", Project: "proj_2"},
		},
		{
			name: "An_anthropic_version_is_a_date",
			toml: "[providers.anthropic]\napi_key_env = \"K\"\napi_version = \"2023-06-01\"\n",
			want: config.Provider{Name: "anthropic", Kind: "anthropic", APIKeyEnv: "K", APIVersion: "2023-06-01"},
		},
		{
			name:    "An_endpoint_that_climbs_is_refused",
			toml:    "[providers.openai]\napi_key_env = \"K\"\nendpoints = [\"chat/completions\", \"../admin\"]\n",
			wantErr: `berth.toml:3: providers.openai.endpoints[1]: "../admin" is not an endpoint path`,
		},
		{
			name:    "A_version_that_is_not_a_date_is_refused",
			toml:    "[providers.anthropic]\napi_key_env = \"K\"\napi_version = \"latest\"\n",
			wantErr: `berth.toml:3: providers.anthropic.api_version: "latest" is not an anthropic-version date`,
		},
		{
			name:    "An_organization_with_a_newline_is_refused",
			toml:    "[providers.openai]\napi_key_env = \"K\"\norganization = \"org\\r\\nX-Evil: 1\"\n",
			wantErr: `berth.toml:3: providers.openai.organization:`,
		},
		{
			name:    "An_organization_for_anthropic_is_refused",
			toml:    "[providers.anthropic]\napi_key_env = \"K\"\norganization = \"org-1\"\n",
			wantErr: `berth.toml:3: providers.anthropic.organization: is for an openai provider, not anthropic`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tt.toml + "[[agents]]\nid = \"ops\"\n"})
			cfg, err := config.Load(path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("loaded; want an error containing %q", tt.wantErr)
				}
				if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tt.wantErr) {
					t.Fatalf("errors = %s\nwant one containing %q", got, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Providers.Entries[tt.want.Name]; !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("provider = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEgressAskRulesAndTheirTimeoutAreReadAndChecked(t *testing.T) {
	t.Parallel()
	agent := "[[agents]]\nid = \"ops\"\n[agents.egress]\n"
	tests := []struct {
		name        string
		toml        string
		wantAsk     []string
		wantTimeout time.Duration
		wantErr     string
	}{
		{
			name:        "Ask_rules_are_read_with_the_default_timeout",
			toml:        agent + "ask = [\"*.example.com\", \"POST api.stripe.com\"]\n",
			wantAsk:     []string{"*.example.com", "POST api.stripe.com"},
			wantTimeout: 10 * time.Minute,
		},
		{
			name:        "Agent_defaults_apply_when_the_agent_sets_none",
			toml:        "[agent_defaults.egress]\nask = [\"*.example.com\"]\napproval_timeout = \"2m\"\n[[agents]]\nid = \"ops\"\n",
			wantAsk:     []string{"*.example.com"},
			wantTimeout: 2 * time.Minute,
		},
		{
			name:        "The_agent's_timeout_beats_the_defaults'",
			toml:        "[agent_defaults.egress]\napproval_timeout = \"2m\"\n" + agent + "ask = [\"a.example\"]\napproval_timeout = \"30s\"\n",
			wantAsk:     []string{"a.example"},
			wantTimeout: 30 * time.Second,
		},
		{
			name:    "A_bad_ask_rule_is_refused_with_file_line_and_key",
			toml:    agent + "allow = [\"pypi.org\"]\nask = [\"a.example\",\n  \"https://api.stripe.com/v1\"]\n",
			wantErr: `berth.toml:6: agents[0].egress.ask[1]: "https://api.stripe.com/v1": a rule names a host, not a URL`,
		},
		{
			name:    "A_bad_ask_rule_in_the_defaults_is_refused_too",
			toml:    "[agent_defaults.egress]\nask = [\"FETCH a.example\"]\n[[agents]]\nid = \"ops\"\n",
			wantErr: `berth.toml:2: agent_defaults.egress.ask[0]: "FETCH a.example": "FETCH" is not an HTTP method`,
		},
		{
			name:    "A_timeout_under_10s_is_refused",
			toml:    agent + "approval_timeout = \"5s\"\n",
			wantErr: "berth.toml:4: agents[0].egress.approval_timeout: must be a length of time from 10s to 24h0m0s, not 5s",
		},
		{
			name:    "A_timeout_over_a_day_is_refused",
			toml:    agent + "approval_timeout = \"25h\"\n",
			wantErr: "agents[0].egress.approval_timeout: must be a length of time from 10s to 24h0m0s, not 25h0m0s",
		},
		{
			name:    "A_timeout_that_is_no_duration_is_refused",
			toml:    agent + "approval_timeout = \"soon\"\n",
			wantErr: "berth.toml:4: agents[0].egress.approval_timeout",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tt.toml})
			cfg, err := config.Load(path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("loaded; want an error containing %q", tt.wantErr)
				}
				if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tt.wantErr) {
					t.Fatalf("errors = %s\nwant one containing %q", got, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, err := cfg.Agent("ops")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.EgressAsk, tt.wantAsk) || a.EgressApprovalTimeout != tt.wantTimeout {
				t.Fatalf("ask = %q within %s, want %q within %s", a.EgressAsk, a.EgressApprovalTimeout, tt.wantAsk, tt.wantTimeout)
			}
		})
	}
}

func TestToolAskRulesAreReadAndChecked(t *testing.T) {
	t.Parallel()
	agent := "[[agents]]\nid = \"ops\"\n[agents.tools]\n"
	tests := []struct {
		name    string
		toml    string
		wantAsk []string
		wantErr string
	}{
		{
			name:    "A_tool_name_and_shell_patterns_are_read",
			toml:    agent + "ask = [\"write_file\", \"shell: git push *\", \"mcp__files__delete\"]\n",
			wantAsk: []string{"write_file", "shell: git push *", "mcp__files__delete"},
		},
		{
			name:    "Agent_defaults_apply_when_the_agent_sets_none",
			toml:    "[agent_defaults.tools]\nask = [\"shell\"]\n[[agents]]\nid = \"ops\"\n",
			wantAsk: []string{"shell"},
		},
		{
			name:    "A_misspelt_tool_is_refused_with_file_line_and_key",
			toml:    agent + "ask = [\"shell\",\n  \"shel: rm -rf *\"]\n",
			wantErr: `berth.toml:5: agents[0].tools.ask[1]: "shel: rm -rf *": berth-agent has no tool "shel"`,
		},
		{
			name:    "An_unknown_tool_is_refused",
			toml:    agent + "ask = [\"shel\"]\n",
			wantErr: `berth.toml:4: agents[0].tools.ask[0]: "shel": berth-agent has no tool "shel"`,
		},
		{
			name:    "A_pattern_on_another_tool_is_refused",
			toml:    agent + "ask = [\"write_file: *.go\"]\n",
			wantErr: `berth.toml:4: agents[0].tools.ask[0]: "write_file: *.go": a pattern matches shell commands only`,
		},
		{
			name:    "A_pattern_that_matches_everything_is_refused_in_the_defaults_too",
			toml:    "[agent_defaults.tools]\nask = [\"shell: *\"]\n[[agents]]\nid = \"ops\"\n",
			wantErr: `berth.toml:2: agent_defaults.tools.ask[0]: "shell: *": the pattern matches every command`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tt.toml})
			cfg, err := config.Load(path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("loaded; want an error containing %q", tt.wantErr)
				}
				if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tt.wantErr) {
					t.Fatalf("errors = %s\nwant one containing %q", got, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, err := cfg.Agent("ops")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.Tools.Ask, tt.wantAsk) {
				t.Fatalf("ask = %q, want %q", a.Tools.Ask, tt.wantAsk)
			}
		})
	}
}
