package egress

import (
	"net/http"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Read-only egress ([agents.egress] mode = "read-only"): the judge says
// what may pass (egresspolicy/readonly.go); here the proxy makes sure it
// can see every request, intercepting each tunnel it opens.

// hasBody says whether r carries a body: a length over 0, or one unknown
// (chunked).
func hasBody(r *http.Request) bool {
	return r.ContentLength != 0 || len(r.TransferEncoding) > 0
}

// readOnlyTunnel serves a CONNECT of a read-only run (no secret, no git
// rule for its host) and says whether it did: intercepted with the run's
// CA when the rule that allows it names a host or a domain, so each
// request inside is judged; refused otherwise. A run that is not
// read-only is left to the plain tunnel.
func (s *Server) readOnlyTunnel(w http.ResponseWriter, r *http.Request, d egresspolicy.Decision, dest egresspolicy.Destination) bool {
	j := s.judgeFor(r.Context())
	if !j.ReadOnly || j.AgentChannel {
		return false
	}
	if ref := j.ReadOnlyTunnel(d.Host, d.Port, s.icpt != nil && dest.Rule.Host != "*"); ref != nil {
		s.refusal(w, d, ref)
		return true
	}
	d.Rule = dest.Rule.Raw + " (read-only: intercepted)"
	s.intercept(w, r, d, nil)
	return true
}

// readOnlyInside judges a request inside an intercepted tunnel of a
// read-only run: git's fetches pass (the git rules judge them), pushes
// and any other method or body do not.
func (s *Server) readOnlyInside(j *egresspolicy.Judge, req *http.Request, escaped, host string, port int) *egresspolicy.Refusal {
	if !j.ReadOnly || j.AgentChannel {
		return nil
	}
	if s.judge.GitHost(host, port) {
		if g, isGit, err := egresspolicy.ParseGitRequest(req.Method, escaped, req.URL.RawQuery); isGit {
			if err != nil {
				return nil // the git rules refuse it, saying why
			}
			return j.ReadOnlyGit(g)
		}
	}
	return j.ReadOnlyRefusal(req.Method, hasBody(req))
}
