package runplan_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// gitKey stands in for an app's PEM key: runplan reads it, never parses it.
const gitKey = "-----BEGIN RSA PRIVATE KEY-----\nGIT-APP-KEY-0815\n-----END RSA PRIVATE KEY-----"

// gitConfig has agent web with git rules and nothing else to reach: no
// remote provider, no allow rule, no secret for a host it reaches.
func gitConfig(t *testing.T, keyFile string) string {
	t.Helper()
	return `
[[egress.github_apps]]
name            = "acme-bot"
app_id          = 12345
installation_id = 678
private_key     = "` + keyFile + `"
api_base_url    = "https://forge.test/api/v3"

[[egress.secrets]]
name  = "lint-token"
env   = "LINT_TOKEN"
hosts = ["git.example.com"]

[[agents]]
id       = "web"
provider = "local"
[[agents.egress.git]]
remote     = "https://forge.test/acme/web.git"
fetch      = true
push       = ["berth/*"]
credential = "acme-bot"
[[agents.egress.git]]
remote     = "https://git.example.com/tools/lint.git"
fetch      = true
credential = "lint-token"
`
}

func TestGitRulesGiveARunItsEgressProxyWithTheRulesTheAppsAndACA(t *testing.T) {
	t.Parallel()
	keyFile := filepath.Join(t.TempDir(), "acme-bot.pem")
	if err := os.WriteFile(keyFile, []byte(gitKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, gitConfig(t, keyFile))
	host := facts(t, map[string]string{"LINT_TOKEN": "lint-token-value"})
	p, err := runplan.Compile(cfg, "web", "r1", host)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	e := p.Egress
	if e == nil {
		t.Fatal("no egress plan: a run with git rules and nothing else to reach needs its proxy")
	}
	wantRules := []egresspolicy.GitRule{
		{Remote: "https://forge.test/acme/web.git", Fetch: true, Push: []string{"berth/*"}, Credential: "acme-bot"},
		{Remote: "https://git.example.com/tools/lint.git", Fetch: true, Credential: "lint-token"},
	}
	if !reflect.DeepEqual(e.Git, wantRules) || e.Agent != "web" {
		t.Errorf("git rules %+v of agent %q, want %+v of web", e.Git, e.Agent, wantRules)
	}
	wantApps := []egresspolicy.GitHubApp{{Name: "acme-bot", AppID: 12345, InstallationID: 678, APIBaseURL: "https://forge.test/api/v3", PrivateKey: gitKey}}
	if !reflect.DeepEqual(e.GitHubApps, wantApps) {
		t.Errorf("apps %+v, want %+v (the key read from its file)", e.GitHubApps, wantApps)
	}
	// The rule's secret travels for the rule's host though no allow rule
	// reaches it: the proxy adds it to that rule's git requests only.
	i := slices.IndexFunc(e.Secrets, func(s isolation.EgressSecret) bool { return s.Name == "lint-token" })
	if i < 0 || e.Secrets[i].Value != "lint-token-value" || !slices.Equal(e.Secrets[i].Hosts, []string{"git.example.com"}) {
		t.Errorf("secrets %+v, want lint-token's value for git.example.com", e.Secrets)
	}
	if want := filepath.Join(host.StateDir, "egress", "r1", isolation.EgressCABundleName); e.CABundle != want || e.SandboxCABundle != want {
		t.Errorf("CA bundle %q (sandbox %q), want %q: the proxy intercepts the git hosts", e.CABundle, e.SandboxCABundle, want)
	}
	if !slices.Contains(p.Policy.AllowRead, filepath.Dir(e.CABundle)) {
		t.Errorf("policy read %v, want the run's egress directory readable (the CA bundle)", p.Policy.AllowRead)
	}
	if !slices.Contains(p.Protected, keyFile) {
		t.Errorf("protected %v, want the app's key file %s", p.Protected, keyFile)
	}

	// What may be shown, logged or sent holds no key.
	red, err := json.Marshal(p.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(red), "GIT-APP-KEY") || strings.Contains(string(red), "lint-token-value") {
		t.Errorf("the redacted plan holds a key: %s", red)
	}
	if p.Redacted().Egress.GitHubApps[0].PrivateKey != "" || e.GitHubApps[0].PrivateKey == "" {
		t.Error("Redacted must blank the app's key in its copy only")
	}

	ex, err := runplan.Explain(cfg, "web", host)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"git rules (smart HTTP judged per repository and ref; TLS to forge.test, git.example.com intercepted with the run's CA",
		"https://forge.test/acme/web.git: fetch; push to berth/* (fast-forward only, no delete), credential acme-bot added by the proxy on these repositories' requests only (a token minted for the run, restricted to them, revoked at its end)",
	} {
		if !strings.Contains(ex.Why["egress"], want) {
			t.Errorf("why egress = %s\nwant it to contain %s", ex.Why["egress"], want)
		}
	}
}

func TestAnAppKeyThatCannotBeReadIsAProblemNamingTheApp(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, gitConfig(t, "/nonexistent/acme-bot.pem"))
	_, err := runplan.Compile(cfg, "web", "r1", facts(t, map[string]string{"LINT_TOKEN": "v"}))
	if err == nil || !strings.Contains(err.Error(), "the private key of GitHub app acme-bot") {
		t.Fatalf("Compile: %v, want a problem naming the app's key", err)
	}
}
