package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// fullAgent sets every key of [[agents]] to a value other than its default.
const fullAgent = `
[[agents]]
id = "full"
name = "Full"
workspace = "/srv/full"
provider = "local"
model = "m1"
max_iterations = 7
workspace_quota = "2g"

[agents.tools]
allow = ["read"]
deny = ["shell"]
ask = ["write_file"]

[agents.container_mode]
enabled = true
image = "berth/custom"
memory_limit = "768m"
timeout_seconds = 45
network = "none"
runtime = "runc"
warm = 1
binds = ["/srv/data:/data:ro"]
security_opt = ["apparmor=berth-agent"]

[agents.file_access]
unrestricted = false
allow_read = ["/srv"]
allow_read_write = ["/srv/out"]
deny = ["/srv/secret"]
allow_home_dotfiles = true
allow_network = false

[agents.image_config]
enabled = true
image = "berth/full:1"
base_image = "debian:12"
packages = ["jq"]
env_vars = { LANG = "C.UTF-8" }

[agents.egress]
allow = ["example.com"]
ask = ["*.example.org"]
approval_timeout = "3m"
mode = "read-only"

[agents.budget]
tokens_per_day = 100000
cost_per_day = 2.5
cost_per_run = 0.25
requests_per_minute = 20

[[agents.egress.git]]
remote = "https://example.com/acme/web.git"
fetch = true
push = ["berth/*"]
force = true
delete = true
credential = "search"

[agents.sandbox]
scope = "conversation"
idle_stop = "5m"
max_lifetime = "2h"
max_per_agent = 2

[[agents.mcp]]
name = "files"
command = ["mcp-files", "/srv"]
tools = ["read"]
timeout = "45s"

[agents.web_search]
provider = "searxng"
base_url = "https://example.com"
secret = "search"
` + fullAgentSecret

// fullAgentSecret is the [[egress.secrets]] entry fullAgent's web_search
// names; config check --agent does not show it, so it is read back with it.
const fullAgentSecret = `
[[egress.secrets]]
name = "search"
env = "SEARCH_KEY"
hosts = ["example.com"]
`

// `berthctl config check --agent` shows every key an agent has, found by
// walking AgentSettings' tags as the decoder does, and what it shows reads
// back as the same agent.
func TestConfigCheckShowsEveryAgentKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, []byte(fullAgent), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteCheck(&out, path, "full"); err != nil {
		t.Fatalf("WriteCheck: %v\n%s", err, out.String())
	}
	_, body, _ := strings.Cut(out.String(), "\n") // past the summary line
	var shown map[string]any
	if _, err := toml.Decode(body, &shown); err != nil {
		t.Fatalf("config check's output is not TOML: %v\n%s", err, out.String())
	}
	agent, _ := shown["agents"].(map[string]any)["full"].(map[string]any)
	for _, key := range agentKeys(reflect.TypeFor[AgentSettings](), "") {
		if !hasKey(agent, key) {
			t.Errorf("config check does not show %s: fill it in settingsOf, and set it in fullAgent", key)
		}
	}

	// Read back: the shown table as berth.toml's one agent.
	delete(agent, "isolation")
	agent["id"] = "full"
	var again bytes.Buffer
	if err := toml.NewEncoder(&again).Encode(map[string]any{"agents": []map[string]any{agent}}); err != nil {
		t.Fatal(err)
	}
	againPath := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(againPath, append(again.Bytes(), fullAgentSecret...), 0o600); err != nil {
		t.Fatal(err)
	}
	want, _ := mustLoad(t, path).Agent("full")
	got, err := mustLoad(t, againPath).Agent("full")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("config check's agent reads back as\n%+v, %v\nwant\n%+v\nfrom\n%s", got, err, want, again.String())
	}
}

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// agentKeys are the keys of a settings table, walked from its tags: sub-tables'
// keys dotted, without id (the table's name).
func agentKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	for _, f := range specsOf(typ) {
		key := joinKey(prefix, f.key)
		switch {
		case key == "id":
		case f.kind == kindSection:
			keys = append(keys, agentKeys(f.typ, key)...)
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

func hasKey(table map[string]any, dotted string) bool {
	parts := strings.Split(dotted, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := table[p].(map[string]any)
		if !ok {
			return false
		}
		table = sub
	}
	_, ok := table[parts[len(parts)-1]]
	return ok
}
