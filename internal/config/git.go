package config

import (
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// GitRule is one [[agents.egress.git]] entry (also in [agent_defaults]):
// what the agent may do over git's smart HTTP with the repositories at
// Remote, judged by the egress proxy (egresspolicy.GitRule,
// docs/adr/0019-git-aware-egress.md).
type GitRule struct {
	Remote string `toml:"remote" berth:"check=nonEmpty"`
	Fetch  bool   `toml:"fetch"`
	// Push are the branch globs the agent may update ("berth/*").
	Push   []string `toml:"push" berth:"check=nonEmpty"`
	Force  bool     `toml:"force"`
	Delete bool     `toml:"delete"`
	// Credential names an [[egress.secrets]] or [[egress.github_apps]]
	// entry, which the proxy adds to this rule's requests only.
	Credential string `toml:"credential" berth:"check=nonEmpty"`
}

// GitHubApp is one [[egress.github_apps]] entry: the egress proxy mints
// each run an installation token restricted to the repositories of its git
// rules, and revokes it when the run ends.
type GitHubApp struct {
	Name           string `toml:"name" berth:"check=nonEmpty"`
	AppID          int    `toml:"app_id" berth:"check=atLeastOne"`
	InstallationID int    `toml:"installation_id" berth:"check=atLeastOne"`
	// PrivateKey is the file holding the app's PEM key, like an
	// [[egress.secrets]] file: absolute, or relative to
	// $CREDENTIALS_DIRECTORY. Never the key itself.
	PrivateKey string `toml:"private_key" berth:"check=nonEmpty"`
	// APIBaseURL is the API's root; empty is GitHub's (set for GitHub
	// Enterprise Server, or a fake in tests).
	APIBaseURL string `toml:"api_base_url" berth:"check=httpURL"`
}

// githubGitHost is where GitHub serves git; an app's token is sent there,
// or to the host of its api_base_url, never elsewhere.
const githubGitHost = "github.com"

// GitHosts are the hosts an app's credential may be sent to by a git rule.
func (a GitHubApp) GitHosts() []string {
	if a.APIBaseURL == "" {
		return []string{githubGitHost}
	}
	u, err := url.Parse(a.APIBaseURL)
	if err != nil {
		return nil
	}
	return []string{egresspolicy.NormalHost(u.Hostname())}
}

// EgressPolicyRules are the rules as the egress proxy judges them.
func EgressPolicyRules(rules []GitRule) []egresspolicy.GitRule {
	var out []egresspolicy.GitRule
	for _, r := range rules {
		out = append(out, egresspolicy.GitRule{Remote: r.Remote, Fetch: r.Fetch, Push: slices.Clone(r.Push),
			Force: r.Force, Delete: r.Delete, Credential: r.Credential})
	}
	return out
}

// gitRulesOf resolves an agent's git rules: the agent's list when it sets
// one (even empty), else [agent_defaults]'s.
func gitRulesOf(s, d []GitRule) []GitRule {
	list := s
	if list == nil {
		list = d
	}
	out := make([]GitRule, 0, len(list))
	for _, r := range list {
		r.Push = slices.Clone(r.Push)
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// gitMerged checks every agent's git rules and the [[egress.github_apps]]
// against the merged configuration: what the proxy would refuse at a run's
// start is refused here, at its file, line and key.
func (t *tree) gitMerged(into *checks) {
	apps := map[string]*entry[GitHubApp]{}
	seen := map[string]loc{}
	for _, e := range t.v.Egress.GitHubApps {
		into.githubApp(e, seen)
		apps[e.v.Name] = e
	}
	secrets := map[string]*entry[EgressSecret]{}
	for _, e := range t.v.Egress.Secrets {
		if _, dup := apps[e.v.Name]; dup {
			into.fail(e.at["name"], "%q is also the name of an [[egress.github_apps]] entry: a git rule's credential must name one of them", e.v.Name)
		}
		secrets[e.v.Name] = e
	}
	// [agent_defaults]' rules are checked once per agent; an error that is
	// not the agent's own is reported once.
	var c checks
	defer func() {
		reported := map[string]bool{}
		for _, e := range c.errs {
			if s := e.Error(); !reported[s] {
				reported[s] = true
				into.errs = append(into.errs, e)
			}
		}
	}()
	d := t.v.AgentDefaults
	for _, a := range t.v.Agents {
		v := agentView{tree: t, agent: a, defaults: d, secrets: secrets}
		at, self, rules := d.at, d.self, d.v.Egress.Git
		if _, ok := a.at["egress.git"]; ok {
			at, self, rules = a.at, a.self, a.v.Egress.Git
		}
		if len(rules) == 0 {
			continue
		}
		if why := v.directNetwork(); why != "" {
			c.fail(where(at, self, "egress.git"), "git rules are enforced by the egress proxy, which agent %q's runs do not have (%s)", v.id(), why)
			continue
		}
		for i := range rules {
			v.gitRule(&c, at, self, i, &rules[i], apps)
		}
	}
}

func (c *checks) githubApp(e *entry[GitHubApp], seen map[string]loc) {
	if _, ok := e.at["name"]; !ok {
		c.fail(where(e.at, e.self, "name"), "is required: git rules name the app in credential")
	} else if first, dup := seen[e.v.Name]; dup {
		c.fail(e.at["name"], "GitHub app %q is already defined on line %d", e.v.Name, first.line)
	} else {
		seen[e.v.Name] = e.at["name"]
	}
	for _, key := range []string{"app_id", "installation_id"} {
		if _, ok := e.at[key]; !ok {
			c.fail(where(e.at, e.self, key), "is required (the app's settings on GitHub show it)")
		}
	}
	if _, ok := e.at["private_key"]; !ok {
		c.fail(where(e.at, e.self, "private_key"), "is required: the file holding the app's private key (absolute, or relative to $CREDENTIALS_DIRECTORY)")
	}
	if l, ok := e.at["api_base_url"]; ok && !strings.HasPrefix(e.v.APIBaseURL, "https://") {
		c.fail(l, "%q must be an https URL: the app's tokens travel to it", e.v.APIBaseURL)
	}
}

// gitRule checks one rule as egresspolicy.CheckGitRules would, each error
// at the key it is about, and what the proxy refuses at a run's start: a
// credential for another host than the rule's.
func (v agentView) gitRule(c *checks, at fieldLocs, self loc, i int, r *GitRule, apps map[string]*entry[GitHubApp]) {
	elem := where(at, self, indexKey("egress.git", i))
	key := func(name string) loc { return where(at, elem, indexKey("egress.git", i)+"."+name) }
	errs := len(c.errs)
	if _, ok := at[indexKey("egress.git", i)+".remote"]; !ok {
		c.fail(where(nil, elem, "remote"), "is required: the repository's https URL (https://host/owner/repo.git, or a glob like https://host/owner/*)")
		return
	}
	rem, err := egresspolicy.ParseGitRemote(r.Remote)
	if err != nil {
		c.fail(key("remote"), "%s", err)
		return
	}
	pushes := key("push")
	for j, g := range r.Push {
		if err := (egresspolicy.GitRule{Remote: r.Remote, Push: []string{g}}).Check(); err != nil {
			c.fail(pushes.elem(j), "%s", err)
		}
	}
	if !r.Fetch && len(r.Push) == 0 {
		c.fail(elem, "git rule %s allows nothing: set fetch = true or push branches", r.Remote)
	}
	for _, name := range []string{"force", "delete"} {
		if l, ok := at[indexKey("egress.git", i)+"."+name]; ok && len(r.Push) == 0 && (r.Force && name == "force" || r.Delete && name == "delete") {
			c.fail(l, "needs push branches: it is about the updates of a push")
		}
	}
	if l, ok := at[indexKey("egress.git", i)+".credential"]; ok {
		v.gitCredential(c, l, r, rem, apps)
	}
	if len(c.errs) == errs {
		// What the proxy refuses, config refuses, even if a check above
		// missed it.
		names := append(slices.Collect(maps.Keys(apps)), slices.Collect(maps.Keys(v.secrets))...)
		if err := egresspolicy.CheckGitRules(EgressPolicyRules([]GitRule{*r}), names); err != nil {
			c.fail(elem, "%s", err)
		}
	}
}

// gitCredential checks that a rule's credential exists and goes only to
// the rule's host: a GitHub app's token to GitHub (or its api_base_url's
// host), a secret to a host and port it names.
func (v agentView) gitCredential(c *checks, l loc, r *GitRule, rem egresspolicy.GitRemote, apps map[string]*entry[GitHubApp]) {
	if app, ok := apps[r.Credential]; ok {
		if hosts := app.v.GitHosts(); !slices.Contains(hosts, rem.Host) {
			c.fail(l, "GitHub app %q's token is for %s, not %s: a rule for another host would send it there", r.Credential, strings.Join(hosts, ", "), rem.Host)
		}
		return
	}
	sec, ok := v.secrets[r.Credential]
	if !ok {
		c.fail(l, "credential %q is neither an [[egress.secrets]] nor an [[egress.github_apps]] name (defined: %s)", r.Credential, strings.Join(v.credentialNames(apps), ", "))
		return
	}
	s := egresspolicy.Secret{Name: sec.v.Name, Hosts: normalHosts(sec.v.Hosts), Ports: sec.v.Ports}
	if !s.For(rem.Host, rem.Port) {
		c.fail(l, "secret %q is not for %s:%d of git rule %s: its hosts are %s, its ports %v (empty: any)", r.Credential, rem.Host, rem.Port, r.Remote, strings.Join(sec.v.Hosts, ", "), sec.v.Ports)
	}
}

func normalHosts(hosts []string) []string {
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = egresspolicy.NormalHost(h)
	}
	return out
}

func (v agentView) credentialNames(apps map[string]*entry[GitHubApp]) []string {
	var names []string
	for _, e := range v.tree.v.Egress.Secrets {
		names = append(names, e.v.Name)
	}
	for _, e := range v.tree.v.Egress.GitHubApps {
		names = append(names, e.v.Name)
	}
	if len(names) == 0 {
		return []string{"none"}
	}
	return names
}

// resolveGitHubApps are the merged [[egress.github_apps]].
func (t *tree) resolveGitHubApps() []GitHubApp {
	var out []GitHubApp
	for _, e := range t.v.Egress.GitHubApps {
		out = append(out, e.v)
	}
	return out
}

// GitHubApp is the [[egress.github_apps]] entry called name.
func (c *Config) GitHubApp(name string) (GitHubApp, bool) {
	i := slices.IndexFunc(c.GitHubApps, func(a GitHubApp) bool { return a.Name == name })
	if i < 0 {
		return GitHubApp{}, false
	}
	return c.GitHubApps[i], true
}
