package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

const githubApp = `
[[egress.github_apps]]
name            = "acme-bot"
app_id          = 12345
installation_id = 678
private_key     = "acme-bot.pem"
`

const forgeToken = `
[[egress.secrets]]
name  = "forge"
env   = "FORGE_TOKEN"
hosts = ["git.example.com"]
`

func TestGitRulesAndGitHubAppsResolveFromTheAgentElseTheDefaults(t *testing.T) {
	t.Parallel()
	c := load(t, githubApp+forgeToken+`
[[agent_defaults.egress.git]]
remote     = "https://github.com/acme/*"
fetch      = true
credential = "acme-bot"

[[agents]]
id = "plain"

[[agents]]
id = "web"
[[agents.egress.git]]
remote     = "https://github.com/acme/web.git"
fetch      = true
push       = ["berth/*", "refs/heads/agent/*"]
force      = true
credential = "acme-bot"
[[agents.egress.git]]
remote     = "https://git.example.com/tools/lint.git"
fetch      = true
credential = "forge"

[[agents]]
id = "none"
[agents.egress]
git = []
`)
	plain, _ := c.Agent("plain")
	if want := []config.GitRule{{Remote: "https://github.com/acme/*", Fetch: true, Credential: "acme-bot"}}; !reflect.DeepEqual(plain.EgressGit, want) {
		t.Errorf("plain's git rules = %+v, want [agent_defaults]' %+v", plain.EgressGit, want)
	}
	web, _ := c.Agent("web")
	want := []config.GitRule{
		{Remote: "https://github.com/acme/web.git", Fetch: true, Push: []string{"berth/*", "refs/heads/agent/*"}, Force: true, Credential: "acme-bot"},
		{Remote: "https://git.example.com/tools/lint.git", Fetch: true, Credential: "forge"},
	}
	if !reflect.DeepEqual(web.EgressGit, want) {
		t.Errorf("web's git rules = %+v, want its own, which replace the defaults' whole: %+v", web.EgressGit, want)
	}
	if none, _ := c.Agent("none"); none.EgressGit != nil {
		t.Errorf("git = [] gave %+v, want no rule (the defaults' replaced)", none.EgressGit)
	}
	wantApps := []config.GitHubApp{{Name: "acme-bot", AppID: 12345, InstallationID: 678, PrivateKey: "acme-bot.pem"}}
	if !reflect.DeepEqual(c.GitHubApps, wantApps) {
		t.Errorf("GitHubApps = %+v, want %+v", c.GitHubApps, wantApps)
	}
}

func TestADropInChangesAGitHubAppByName(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{
		"berth.toml":           githubApp,
		"berth.d/50-ghes.toml": "[[egress.github_apps]]\nname = \"acme-bot\"\napi_base_url = \"https://ghes.example.com/api/v3\"\n",
	})
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.GitHubApp{{Name: "acme-bot", AppID: 12345, InstallationID: 678, PrivateKey: "acme-bot.pem", APIBaseURL: "https://ghes.example.com/api/v3"}}
	if !reflect.DeepEqual(c.GitHubApps, want) {
		t.Errorf("GitHubApps = %+v, want the drop-in's api_base_url on the same app: %+v", c.GitHubApps, want)
	}
}

func TestGitRulesAndAppsRefuseWhatTheProxyWouldRefuseNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	agent := "[[agents]]\nid = \"web\"\n"
	rule := func(lines ...string) string {
		return agent + "[[agents.egress.git]]\n" + strings.Join(lines, "\n") + "\n"
	}
	for _, tc := range []struct{ name, toml, want string }{
		{"Error_when_the_remote_is_missing",
			rule("fetch = true"),
			"berth.toml:3: agents[0].egress.git[0].remote: is required"},
		{"Error_when_the_remote_is_not_https",
			rule(`remote = "http://github.com/acme/web.git"`, "fetch = true"),
			`berth.toml:4: agents[0].egress.git[0].remote: remote "http://github.com/acme/web.git" is not an https URL of a repository`},
		{"Error_when_the_remote_host_is_a_glob",
			rule(`remote = "https://*.example.com/acme/web.git"`, "fetch = true"),
			"agents[0].egress.git[0].remote: remote \"https://*.example.com/acme/web.git\": the host must be a name or an address, without a glob"},
		{"Error_when_the_rule_allows_nothing",
			rule(`remote = "https://github.com/acme/web.git"`),
			"berth.toml:3: agents[0].egress.git[0]: git rule https://github.com/acme/web.git allows nothing: set fetch = true or push branches"},
		{"Error_when_a_push_glob_is_a_tag",
			rule(`remote = "https://github.com/acme/web.git"`, `push = ["berth/*", "refs/tags/v1"]`),
			`berth.toml:5: agents[0].egress.git[0].push[1]: git rule https://github.com/acme/web.git: push "refs/tags/v1" is not a branch glob`},
		{"Error_when_force_has_no_push",
			rule(`remote = "https://github.com/acme/web.git"`, "fetch = true", "force = true"),
			"berth.toml:6: agents[0].egress.git[0].force: needs push branches"},
		{"Error_when_delete_has_no_push",
			rule(`remote = "https://github.com/acme/web.git"`, "fetch = true", "delete = true"),
			"berth.toml:6: agents[0].egress.git[0].delete: needs push branches"},
		{"Error_when_the_credential_names_nothing",
			forgeToken + rule(`remote = "https://git.example.com/acme/web.git"`, "fetch = true", `credential = "nope"`),
			`berth.toml:11: agents[0].egress.git[0].credential: credential "nope" is neither an [[egress.secrets]] nor an [[egress.github_apps]] name (defined: forge)`},
		{"Error_when_an_app_token_would_go_to_another_host",
			githubApp + rule(`remote = "https://gitlab.example.com/acme/web.git"`, "fetch = true", `credential = "acme-bot"`),
			`berth.toml:12: agents[0].egress.git[0].credential: GitHub app "acme-bot"'s token is for github.com, not gitlab.example.com: a rule for another host would send it there`},
		{"Error_when_a_GHES_app_token_would_go_to_github",
			githubApp + `api_base_url = "https://ghes.example.com/api/v3"` + "\n" + rule(`remote = "https://github.com/acme/web.git"`, "fetch = true", `credential = "acme-bot"`),
			`GitHub app "acme-bot"'s token is for ghes.example.com, not github.com`},
		{"Error_when_a_secret_is_not_for_the_rule's_host",
			forgeToken + rule(`remote = "https://github.com/acme/web.git"`, "fetch = true", `credential = "forge"`),
			`berth.toml:11: agents[0].egress.git[0].credential: secret "forge" is not for github.com:443 of git rule https://github.com/acme/web.git`},
		{"Error_when_the_agent_has_a_direct_network",
			agent + "[agents.file_access]\nallow_network = true\n[[agents.egress.git]]\nremote = \"https://github.com/acme/web.git\"\nfetch = true\n",
			`agents[0].egress.git: git rules are enforced by the egress proxy, which agent "web"'s runs do not have (file_access.allow_network = true)`},
		{"Error_when_a_defaults_rule_is_bad",
			"[[agent_defaults.egress.git]]\nremote = \"https://github.com/acme/web.git\"\n" + agent,
			"berth.toml:1: agent_defaults.egress.git[0]: git rule https://github.com/acme/web.git allows nothing"},
		{"Error_when_an_app_has_no_private_key",
			"[[egress.github_apps]]\nname = \"bot\"\napp_id = 1\ninstallation_id = 2\n",
			"berth.toml:1: egress.github_apps[0].private_key: is required: the file holding the app's private key"},
		{"Error_when_an_app_has_no_ids",
			"[[egress.github_apps]]\nname = \"bot\"\nprivate_key = \"/etc/berth/bot.pem\"\n",
			"berth.toml:1: egress.github_apps[0].app_id: is required"},
		{"Error_when_an_app_id_is_zero",
			"[[egress.github_apps]]\nname = \"bot\"\napp_id = 0\ninstallation_id = 2\nprivate_key = \"k.pem\"\n",
			"berth.toml:3: egress.github_apps[0].app_id: "},
		{"Error_when_the_api_is_plain_http",
			githubApp + `api_base_url = "http://ghes.example.com/api/v3"` + "\n",
			`berth.toml:7: egress.github_apps[0].api_base_url: "http://ghes.example.com/api/v3" must be an https URL: the app's tokens travel to it`},
		{"Error_when_an_app_and_a_secret_share_a_name",
			githubApp + "[[egress.secrets]]\nname = \"acme-bot\"\nenv = \"X\"\nhosts = [\"github.com\"]\n",
			`berth.toml:8: egress.secrets[0].name: "acme-bot" is also the name of an [[egress.github_apps]] entry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": tc.toml})
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("loaded; want an error containing %q", tc.want)
			}
			if got := strings.Join(errorLines(t, err, path), "\n"); !strings.Contains(got, tc.want) {
				t.Fatalf("errors = %s\nwant one containing %q", got, tc.want)
			}
		})
	}
}
