package config_test

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestAgentImageResolvesAgentThenGlobalThenBuiltIn(t *testing.T) {
	t.Parallel()
	c := load(t, `
[image_config]
enabled = true
packages = ["jq", "git"]
env_vars = { LANG = "C.UTF-8", TZ = "UTC" }

[[agents]]
id = "plain"

[[agents]]
id = "py"
[agents.image_config]
packages = ["python3", "python3-venv"]
base_image = "debian:bookworm-slim"

[[agents]]
id = "off"
[agents.image_config]
enabled = false
env_vars = {}

[[agents]]
id = "fixed"
[agents.image_config]
image = "registry.internal:5000/team/agent:1.2"
`)
	tests := []struct {
		agent string
		want  config.ImageConfig
	}{
		{"plain", config.ImageConfig{Enabled: true, BaseImage: "berth-base:bookworm", Packages: []string{"jq", "git"}, EnvVars: map[string]string{"LANG": "C.UTF-8", "TZ": "UTC"}}},
		{"py", config.ImageConfig{Enabled: true, BaseImage: "debian:bookworm-slim", Packages: []string{"python3", "python3-venv"}, EnvVars: map[string]string{"LANG": "C.UTF-8", "TZ": "UTC"}}},
		{"off", config.ImageConfig{Enabled: false, BaseImage: "berth-base:bookworm", Packages: []string{"jq", "git"}, EnvVars: map[string]string{}}},
		{"fixed", config.ImageConfig{Enabled: true, Image: "registry.internal:5000/team/agent:1.2", BaseImage: "berth-base:bookworm", Packages: []string{"jq", "git"}, EnvVars: map[string]string{"LANG": "C.UTF-8", "TZ": "UTC"}}},
	}
	for _, tc := range tests {
		t.Run("Agent "+tc.agent, func(t *testing.T) {
			t.Parallel()
			a, err := c.Agent(tc.agent)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.Image, tc.want) {
				t.Errorf("Image = %+v, want %+v", a.Image, tc.want)
			}
		})
	}
}

func TestImageConfigDropInReplacesEnvVarsAsAWhole(t *testing.T) {
	t.Parallel()
	c, err := config.Load(writeConfig(t, map[string]string{
		"berth.toml":          "[image_config]\npackages = [\"jq\"]\n[image_config.env_vars]\nLANG = \"C.UTF-8\"\nTZ = \"UTC\"\n\n[[agents]]\nid = \"a\"\n",
		"berth.d/10-img.toml": "[image_config]\nenv_vars = { EDITOR = \"vi\" }\n",
	}))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	a, _ := c.Agent("a")
	want := config.ImageConfig{BaseImage: "berth-base:bookworm", Packages: []string{"jq"}, EnvVars: map[string]string{"EDITOR": "vi"}}
	if !reflect.DeepEqual(a.Image, want) {
		t.Errorf("Image = %+v, want %+v", a.Image, want)
	}
}

func TestLoadRefusesBadImageConfigNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	const keyProvider = "[providers.openai]\napi_key_env = \"OPENAI_API_KEY\"\n"
	tests := []struct {
		name   string
		files  map[string]string
		want   []string
		secret string
	}{
		{
			name:  "A package name that is not a Debian name is reported on its element",
			files: map[string]string{"berth.toml": base + "\n[image_config]\npackages = [\n  \"jq\",\n  \"Python3\",\n  \"curl; rm -rf /\",\n]\n"},
			want: []string{
				`berth.toml:12: image_config.packages[1]: "Python3" is not a Debian package name (lowercase letters, digits, '+', '-', '.', at least 2 characters)`,
				`berth.toml:13: image_config.packages[2]: "curl; rm -rf /" is not a Debian package name (lowercase letters, digits, '+', '-', '.', at least 2 characters)`,
			},
		},
		{
			name:  "An image reference with spaces is refused in an agent's image_config",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.image_config]\nimage = \"my image\"\n"},
			want:  []string{`berth.toml:12: agents[1].image_config.image: "my image" is not an image reference (name[:tag][@sha256:digest], like berth-base:bookworm)`},
		},
		{
			name:  "An env var whose name says secret is refused",
			files: map[string]string{"berth.toml": base + "\n[image_config.env_vars]\nLANG = \"C\"\nGITHUB_TOKEN = \"abc\"\n"},
			want:  []string{`berth.toml:11: image_config.env_vars.GITHUB_TOKEN: looks like a secret; an image's environment is readable by everything in it, so secrets never go there (the egress proxy adds provider keys on the way out)`},
		},
		{
			name:  "An env var named like an API key is refused in an agent",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.image_config]\nenv_vars = { MY_APIKEY = \"x\" }\n"},
			want:  []string{`berth.toml:12: agents[1].image_config.env_vars.MY_APIKEY: looks like a secret; an image's environment is readable by everything in it, so secrets never go there (the egress proxy adds provider keys on the way out)`},
		},
		{
			name:  "An env var under an agent's env_vars header is reported on its own line",
			files: map[string]string{"berth.toml": base + "\n[[agents]]\nid = \"ops\"\n[agents.image_config.env_vars]\nLANG = \"C\"\nDB_PASSWORD = \"x\"\n"},
			want:  []string{`berth.toml:13: agents[1].image_config.env_vars.DB_PASSWORD: looks like a secret; an image's environment is readable by everything in it, so secrets never go there (the egress proxy adds provider keys on the way out)`},
		},
		{
			name:   "An env var holding a token is refused without showing it",
			files:  map[string]string{"berth.toml": base + "\n[image_config.env_vars]\nHELPER = \"sk-proj-abcdefghijklmnop\"\n"},
			want:   []string{`berth.toml:10: image_config.env_vars.HELPER: holds what looks like a token (its value is not shown); secrets never go into an image`},
			secret: "abcdefghijklmnop",
		},
		{
			name:  "An env var that passes a provider's key variable is refused",
			files: map[string]string{"berth.toml": keyProvider + base + "\n[image_config.env_vars]\nFORWARD = \"$OPENAI_API_KEY\"\n"},
			want:  []string{`berth.toml:12: image_config.env_vars.FORWARD: names OPENAI_API_KEY, the API key of a provider; provider keys never go into an image`},
		},
		{
			name: "A provider key variable defined in a drop-in is still caught",
			files: map[string]string{
				"berth.toml":      base + "\n[image_config.env_vars]\nFORWARD = \"OPENAI_API_KEY\"\n",
				"berth.d/10.toml": keyProvider,
			},
			want: []string{`berth.toml:10: image_config.env_vars.FORWARD: names OPENAI_API_KEY, the API key of a provider; provider keys never go into an image`},
		},
		{
			name:  "An env var value that is not a string is a wrong type",
			files: map[string]string{"berth.toml": base + "\n[image_config.env_vars]\nWORKERS = 4\n"},
			want:  []string{`berth.toml:10: image_config.env_vars.WORKERS: must be a string, not an integer`},
		},
		{
			name:  "An unknown image_config key is reported",
			files: map[string]string{"berth.toml": base + "\n[image_config]\npackage = [\"jq\"]\n"},
			want:  []string{`berth.toml:10: image_config.package: unknown key (known keys: base_image, enabled, env_vars, image, packages)`},
		},
		{
			name:  "image_config in agent_defaults is unknown: the global table is the default",
			files: map[string]string{"berth.toml": "[agent_defaults.image_config]\nenabled = true\n" + base},
			want:  []string{`berth.toml:1: agent_defaults.image_config: unknown key (known keys: backend, budget, container_mode, egress, file_access, max_iterations, mcp, model, name, provider, sandbox, tools, web_search, workspace, workspace_quota)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, tc.files)
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", tc.want)
			}
			if got := errorLines(t, err, path); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Load errors:\n%s\nwant:\n%s", join(got), join(tc.want))
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Errorf("error reveals the secret %q:\n%v", tc.secret, err)
			}
		})
	}
}

func TestCheckImageEnvRefusesAProviderKeyValueWithoutShowingIt(t *testing.T) {
	t.Parallel()
	const key = "sk-live-0123456789abcdef"
	c := load(t, `
[providers.openai]
api_key_env = "OPENAI_API_KEY"

[[agents]]
id = "ops"
[agents.image_config]
env_vars = { HELPER_CONFIG = "`+strings.TrimPrefix(key, "sk-")+`" }
`)
	if err := config.CheckImageEnv(c, env{"OPENAI_API_KEY": "other"}.get); err != nil {
		t.Errorf("CheckImageEnv with an unrelated key = %v, want nil", err)
	}
	c.Agents[0].ImageConfig.EnvVars["HELPER_CONFIG"] = key
	err := config.CheckImageEnv(c, env{"OPENAI_API_KEY": key}.get)
	if err == nil || err.Error() != "agents.ops.image_config.env_vars.HELPER_CONFIG: holds the value of OPENAI_API_KEY, a provider's API key; provider keys never go into an image" {
		t.Errorf("CheckImageEnv = %v, want an error naming the agent, the variable and OPENAI_API_KEY", err)
	}
	if err != nil && strings.Contains(err.Error(), key) {
		t.Errorf("error reveals the key: %v", err)
	}
}

func TestWriteCheckShowsTheAgentsImage(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": "[image_config]\nenabled = true\npackages = [\"jq\"]\nenv_vars = { LANG = \"C.UTF-8\" }\n[[agents]]\nid = \"a\"\n"})
	var out bytes.Buffer
	if err := config.WriteCheck(&out, path, "a"); err != nil {
		t.Fatalf("WriteCheck: %v\n%s", err, out.String())
	}
	for _, w := range []string{"[agents.a.image_config]\nenabled = true\nbase_image = \"berth-base:bookworm\"\npackages = [\"jq\"]\n", "[agents.a.image_config.env_vars]\nLANG = \"C.UTF-8\"\n"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output does not contain %q:\n%s", w, out.String())
		}
	}
}
