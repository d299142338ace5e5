package runplan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// gitEgress is what an agent's [[agents.egress.git]] rules add to its
// run's egress: the rules, the [[egress.github_apps]] their credentials
// name (private keys read), and the [[egress.secrets]] they name.
type gitEgress struct {
	rules   []egresspolicy.GitRule
	apps    []egresspolicy.GitHubApp
	secrets []string
}

// gitPlan reads the agent's git rules and what their credentials need. A
// key that cannot be read is a problem: the run's proxy could not start.
func gitPlan(c *compiled, cfg *config.Config, a config.Agent, host HostFacts) gitEgress {
	g := gitEgress{rules: config.EgressPolicyRules(a.EgressGit)}
	for _, r := range g.rules {
		if r.Credential == "" || slices.Contains(g.secrets, r.Credential) || slices.ContainsFunc(g.apps, func(app egresspolicy.GitHubApp) bool { return app.Name == r.Credential }) {
			continue
		}
		app, ok := cfg.GitHubApp(r.Credential)
		if !ok {
			g.secrets = append(g.secrets, r.Credential)
			continue
		}
		key, err := secretValue(config.EgressSecret{File: app.PrivateKey}, getenvOf(host))
		if err != nil {
			c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("the private key of GitHub app %s", app.Name), Err: err})
			continue
		}
		g.apps = append(g.apps, egresspolicy.GitHubApp{Name: app.Name, AppID: int64(app.AppID), InstallationID: int64(app.InstallationID),
			APIBaseURL: app.APIBaseURL, PrivateKey: key})
	}
	return g
}

func getenvOf(host HostFacts) func(string) string {
	if host.Getenv == nil {
		return func(string) string { return "" }
	}
	return host.Getenv
}

// withSecrets adds the secrets the git rules name to the run's, for the
// rules' hosts: the proxy adds such a secret to its rules' git requests
// only, never by host, so no allow rule need reach them.
func (g gitEgress) withSecrets(c *compiled, cfg *config.Config, secrets []isolation.EgressSecret, host HostFacts) []isolation.EgressSecret {
	for _, name := range g.secrets {
		i := slices.IndexFunc(cfg.EgressSecrets, func(s config.EgressSecret) bool { return s.Name == name })
		if i < 0 {
			continue // config refused it
		}
		conf := cfg.EgressSecrets[i]
		var hosts []string
		for _, r := range g.rules {
			rem, err := egresspolicy.ParseGitRemote(r.Remote)
			if err != nil || r.Credential != name {
				continue
			}
			s := egresspolicy.Secret{Hosts: conf.Hosts, Ports: conf.Ports}
			if s.For(rem.Host, rem.Port) && !slices.Contains(hosts, rem.Host) {
				hosts = append(hosts, rem.Host)
			}
		}
		if j := slices.IndexFunc(secrets, func(s isolation.EgressSecret) bool { return s.Name == name }); j >= 0 {
			for _, h := range hosts {
				if !slices.Contains(secrets[j].Hosts, h) {
					secrets[j].Hosts = append(slices.Clone(secrets[j].Hosts), h)
				}
			}
			continue
		}
		value, err := secretValue(conf, getenvOf(host))
		if err != nil {
			c.problems = append(c.problems, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("egress secret %s", name), Err: err})
			continue
		}
		secrets = append(secrets, isolation.EgressSecret{Name: name, Hosts: hosts, Header: conf.Header, Format: conf.Format,
			Ports: conf.Ports, Methods: upper(conf.Methods), Paths: conf.Paths, Value: value})
	}
	return secrets
}

// apply puts the rules and apps into the run's egress plan.
func (g gitEgress) apply(e *isolation.EgressPlan) {
	e.Git, e.GitHubApps = g.rules, g.apps
}

// why is what sandbox explain says of the git rules.
func (g gitEgress) why(e *isolation.EgressPlan) string {
	if len(g.rules) == 0 {
		return ""
	}
	var lines []string
	for _, r := range g.rules {
		var can []string
		if r.Fetch {
			can = append(can, "fetch")
		}
		if len(r.Push) > 0 {
			push := "push to " + strings.Join(r.Push, ", ")
			switch {
			case r.Force && r.Delete:
				push += " (force and delete allowed)"
			case r.Force:
				push += " (force allowed, no delete)"
			case r.Delete:
				push += " (fast-forward only, delete allowed)"
			default:
				push += " (fast-forward only, no delete)"
			}
			can = append(can, push)
		}
		line := fmt.Sprintf("%s: %s", r.Remote, strings.Join(can, "; "))
		if r.Credential != "" {
			line += ", credential " + r.Credential + " added by the proxy on these repositories' requests only"
			if slices.ContainsFunc(g.apps, func(a egresspolicy.GitHubApp) bool { return a.Name == r.Credential }) {
				line += " (a token minted for the run, restricted to them, revoked at its end)"
			}
		}
		lines = append(lines, line)
	}
	return fmt.Sprintf("; git rules (smart HTTP judged per repository and ref; TLS to %s intercepted with the run's CA, trusted through %s): %s",
		strings.Join(egresspolicy.GitHosts(g.rules), ", "), e.SandboxCABundle, strings.Join(lines, "; "))
}
