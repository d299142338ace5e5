package egresspolicy

import (
	"fmt"
	"net/http"
)

// ReadOnlyRefusal says why a tool's request may not leave a read-only run,
// or nil: only GET and HEAD, and without a body (a GET with one is
// refused: a server may act on it). hasBody is whether the request carries
// any (a Content-Length over 0 or a Transfer-Encoding). Provider calls are
// not judged here: they are berth's own calls for the model, on the
// provider's API only, and neither are berth-agent's own (its channel:
// web_search, the admin's MCP servers) (docs/adr/0024-usage-and-budgets.md).
func (j *Judge) ReadOnlyRefusal(method string, hasBody bool) *Refusal {
	if !j.ReadOnly || j.AgentChannel {
		return nil
	}
	if method != http.MethodGet && method != http.MethodHead {
		return refused(http.StatusForbidden, "read-only egress: agent %s may only GET and HEAD, not %s ([agents.egress] mode = \"read-only\")", j.agentName(), method)
	}
	if hasBody {
		return refused(http.StatusForbidden, "read-only egress: agent %s may not send a request body, even with %s ([agents.egress] mode = \"read-only\")", j.agentName(), method)
	}
	return nil
}

// ReadOnlyGit says why a git request may not leave a read-only run, or
// nil: fetches (upload-pack, its advertisement and its calls, which only
// read) pass; a push (receive-pack, its advertisement too, so `git push`
// stops before it packs anything) is refused.
func (j *Judge) ReadOnlyGit(g GitRequest) *Refusal {
	if !j.ReadOnly || j.AgentChannel || g.Service != GitReceivePack {
		return nil
	}
	return refused(http.StatusForbidden, "read-only egress: agent %s may fetch but never push ([agents.egress] mode = \"read-only\")", j.agentName())
}

// ReadOnlyTunnel says why a CONNECT may not open in a read-only run, or
// nil. A tunnel the proxy does not intercept carries requests it cannot
// read, so a read-only run reaches https hosts only where the proxy
// intercepts with the run's CA (intercepted); one whose rule is a bare "*"
// can have no CA.
func (j *Judge) ReadOnlyTunnel(host string, port int, intercepted bool) *Refusal {
	if !j.ReadOnly || j.AgentChannel || intercepted {
		return nil
	}
	return refused(http.StatusForbidden, "read-only egress: %s:%d cannot be tunnelled unread; only hosts the run's CA covers (an allow rule naming a host or *.domain) are reached, each request read", host, port)
}

// ReadOnlyCAHosts are the hosts a read-only run's CA must cover so that
// every tunnel it may open is intercepted: the allow rules' hosts (a glob
// "*.example.com" as example.com, which X.509 name constraints extend to
// the names under it). A bare "*" has no name to constrain to and is left
// out (such tunnels are refused).
func ReadOnlyCAHosts(rules []Rule) []string {
	var hosts []string
	for _, r := range rules {
		h := r.Host
		if h == "*" || h == "" {
			continue
		}
		if len(h) > 2 && h[:2] == "*." {
			h = h[2:]
		}
		hosts = append(hosts, h)
	}
	return hosts
}

func (j *Judge) agentName() string {
	if j.Agent == "" {
		return "(this run)"
	}
	return fmt.Sprintf("%q", j.Agent)
}
