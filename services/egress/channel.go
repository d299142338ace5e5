package egress

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// A run's proxy serves two channels (docs/adr/0026-agent-own-egress-channel.md):
// requests with the run token are the tools' (berth-agent's in-sandbox
// proxy adds it to each); requests with the agent token are berth-agent's
// own (web_search, berth.toml's MCP servers), which it sends straight to
// the run's socket and no tool can send: the token lives only in
// berth-agent's memory. Rules and secrets of an agent tool (AgentTool)
// apply on the agent's channel only.

type channelKey struct{}

// channelOf says which channel r's token opens, and false for none.
func (s *Server) channelOf(r *http.Request) (agent, ok bool) {
	if s.revoked.Load() {
		return false, false
	}
	got, bearer := strings.CutPrefix(r.Header.Get("Proxy-Authorization"), "Bearer ")
	if !bearer {
		return false, false
	}
	if len(s.pol.AgentToken) >= 16 && subtle.ConstantTimeCompare([]byte(got), []byte(s.pol.AgentToken)) == 1 {
		return true, true
	}
	return false, subtle.ConstantTimeCompare([]byte(got), []byte(s.pol.Token)) == 1
}

// onChannel is r with its channel in its context.
func onChannel(r *http.Request, agent bool) *http.Request {
	if !agent {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), channelKey{}, true))
}

// judgeFor is the judge of the channel ctx's request came on.
func (s *Server) judgeFor(ctx context.Context) *egresspolicy.Judge {
	if agent, _ := ctx.Value(channelKey{}).(bool); agent {
		return s.agentJudge
	}
	return s.judge
}

// AgentToken is the token of berth-agent's own channel at this proxy, for
// the run's request on berth-agent's stdin only.
func (p *Proxy) AgentToken() string { return p.agentToken }
