package egress

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Asks inside tunnels (egresspolicy/askinside.go): a tunnel no rule
// allows to a host an inside ask rule names is intercepted, and each
// request in it is judged with its own method.

// askInsideKey marks the context of a tunnel opened for its inside asks.
type askInsideKey struct{}

// opensForAsks reports whether a tunnel refused (ref, not itself an ask)
// is opened and read instead: an inside ask rule names host:port and the
// run's CA can intercept it.
func (s *Server) opensForAsks(ctx context.Context, ref *egresspolicy.Refusal, host string, port int) bool {
	return ref != nil && ref.Ask == nil && ref.Code == http.StatusForbidden && s.icpt != nil &&
		s.judgeFor(ctx).AsksInside(host, port)
}

// openedForAsks reports whether ctx is a tunnel's opened for its asks.
func openedForAsks(ctx context.Context) bool {
	open, _ := ctx.Value(askInsideKey{}).(bool)
	return open
}

// insideDestination judges one request of a tunnel opened for its asks,
// whose CONNECT the rules refused: an inside ask rule that matches its
// method holds it for a person; no rule, a refusal. d's reason names who
// decided.
func (s *Server) insideDestination(ctx context.Context, d *egresspolicy.Decision) (egresspolicy.Destination, *egresspolicy.Refusal) {
	j := s.judgeFor(ctx)
	rule, refusal := j.InsideAsk(d.Method, d.Host, d.Port)
	if refusal != nil {
		return egresspolicy.Destination{}, refusal
	}
	ap := s.hold(ctx, egresspolicy.Ask{Method: d.Method, Host: d.Host, Port: d.Port, Path: d.Path, Rule: rule.Raw})
	d.Reason = ap.reason
	if !ap.allowed {
		return egresspolicy.Destination{}, &egresspolicy.Refusal{Code: http.StatusForbidden, Reason: ap.reason}
	}
	d.Rule = rule.Raw
	dctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	return j.DestinationBy(dctx, rule, d.Host, d.Port)
}
