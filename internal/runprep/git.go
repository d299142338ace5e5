package runprep

import (
	"slices"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// caHosts are the hosts the run's proxy intercepts, which its CA is made
// for: its secrets' and its git rules' (docs/adr/0019-git-aware-egress.md).
func caHosts(e *isolation.EgressPlan) []string {
	var hosts []string
	for _, sec := range e.Secrets {
		hosts = append(hosts, sec.Hosts...)
	}
	for _, h := range egresspolicy.GitHosts(e.Git) {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, h := range egresspolicy.InsideAskHosts(e.Ask) {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if e.ReadOnly {
		// A read-only run's tunnels are all read (docs/adr/0024-usage-and-budgets.md).
		// An asked host, once approved, is read like an allowed one.
		for _, h := range egresspolicy.ReadOnlyCAHosts(slices.Concat(e.Allow, e.Ask)) {
			if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
	}
	return hosts
}

// withGit gives the proxy the run's git rules and the apps their
// credentials name, private keys included (they travel on its stdin only).
func withGit(pol *egress.Policy, e *isolation.EgressPlan) {
	pol.Git = slices.Clone(e.Git)
	pol.GitHubApps = slices.Clone(e.GitHubApps)
}
