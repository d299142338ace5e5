package runplan_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/runplan"
)

// What the proxy may add to a provider call and where a secret applies
// come from the admin's config into the plan; keys and values never show
// in the plan's JSON.
func TestThePlanCarriesProviderSettingsAndSecretScopesButNoValues(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, opsWithoutNetwork+`egress.allow = ["api.github.com", "hooks.example:8443"]

[providers.cloud]
endpoints = ["chat/completions"]
organization = "org-admin"
project = "proj-admin"

[[egress.secrets]]
name = "github"
env = "GITHUB_TOKEN"
hosts = ["api.github.com"]
methods = ["get"]
paths = ["/repos/acme"]

# Only on 443, which no rule allows hooks.example: it does not apply.
[[egress.secrets]]
name = "hooks"
env = "GITHUB_TOKEN"
hosts = ["hooks.example"]
header = "X-Token"
format = "{}"
ports = [443]
`)
	const token = "ghp_scope_SECRET_7"
	p, err := runplan.Compile(cfg, "ops", "r1", facts(t, map[string]string{"CLOUD_KEY": secret, "GITHUB_TOKEN": token}))
	if err != nil {
		t.Fatal(err)
	}
	e := p.Egress
	pr := e.Providers[0]
	if !slices.Equal(pr.Endpoints, []string{"chat/completions"}) || pr.Organization != "org-admin" || pr.Project != "proj-admin" {
		t.Fatalf("provider endpoint %+v; want the config's endpoints, organization and project", pr)
	}
	if len(e.Secrets) != 1 || !slices.Equal(e.Secrets[0].Methods, []string{"GET"}) || !slices.Equal(e.Secrets[0].Paths, []string{"/repos/acme"}) {
		t.Fatalf("secrets %+v; want github with its scope only", e.Secrets)
	}
	// The egress plan is what run records and explain show of egress.
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), token) || strings.Contains(string(data), secret) {
		t.Fatalf("the plan's JSON carries a key or a secret value: %s", data)
	}
	if !strings.Contains(string(data), `"organization":"org-admin"`) || !strings.Contains(string(data), `"paths":["/repos/acme"]`) {
		t.Fatalf("the plan's JSON lost the settings: %s", data)
	}
}
