package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// A tool's request that only an [agents.egress] ask rule matches is held
// here (issue 26): the proxy reports an egresspolicy.Ask (Options.OnAsk; on
// berth-egress's stdout) and waits for the Answer with its ID (Server.Answer;
// on its stdin), the policy's ApprovalTimeout, the tool hanging up or the run
// ending, whichever comes first. An allowed request then goes on as one an
// allow rule allows, judged with the ask rule (only one naming the host
// exactly reaches an internal address).

// asks are the held requests of one proxy and the ask rules a standing
// Answer allowed for the rest of its life.
type asks struct {
	mu       sync.Mutex
	pending  map[string]*heldAsk
	standing map[string]string // ask rule (Raw; a tool rule's AskRule) → who allowed it standing
	closing  chan struct{}     // closed by Server.Close
}

type heldAsk struct {
	rule   string
	answer chan answered // one answer, never more
}

// answered is an Answer as the held request gets it; earlier when another
// request's standing Answer released it.
type answered struct {
	egresspolicy.Answer
	earlier bool
}

// approval is how a held request was decided.
type approval struct {
	allowed bool
	id, by  string
	reason  string
}

// approvedKey carries the ask rule a tunnel was approved by to the
// requests inside it (an intercepted tunnel judges each), so one approval
// covers the tunnel.
type approvedKey struct{}

func newAskID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cannot make an ask id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// approvalTimeout is how long a held request waits for its Answer.
func (s *Server) approvalTimeout() time.Duration {
	if s.pol.ApprovalTimeout > 0 {
		return s.pol.ApprovalTimeout
	}
	return egresspolicy.DefaultApprovalTimeout
}

// destinationAsking is destination, but a request only an ask rule matches
// is held until it is answered: d's reason names who decided, and the context returned carries the approval to the requests
// inside an approved tunnel.
func (s *Server) destinationAsking(ctx context.Context, d *egresspolicy.Decision) (context.Context, egresspolicy.Destination, *egresspolicy.Refusal) {
	dest, ref := s.destination(ctx, d.Method, d.Host, d.Port)
	if ref == nil || ref.Ask == nil {
		return ctx, dest, ref
	}
	rule := *ref.Ask
	ap := s.hold(ctx, egresspolicy.Ask{Method: d.Method, Host: d.Host, Port: d.Port, Path: d.Path, Rule: rule.Raw})
	d.Reason = ap.reason
	if !ap.allowed {
		return ctx, egresspolicy.Destination{}, &egresspolicy.Refusal{Code: http.StatusForbidden, Reason: ap.reason}
	}
	ctx = context.WithValue(ctx, approvedKey{}, rule.Raw)
	dctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	dest, ref = s.judgeFor(ctx).DestinationBy(dctx, rule, d.Host, d.Port)
	return ctx, dest, ref
}

// approvedDestination judges a request inside a tunnel a person approved
// by ask rule rule: the approval covers it.
func (s *Server) approvedDestination(ctx context.Context, ref *egresspolicy.Refusal, host string, port int) (egresspolicy.Destination, *egresspolicy.Refusal, bool) {
	raw, _ := ctx.Value(approvedKey{}).(string)
	if ref == nil || ref.Ask == nil || raw == "" || raw != ref.Ask.Raw {
		return egresspolicy.Destination{}, nil, false
	}
	dest, r := s.judgeFor(ctx).DestinationBy(ctx, *ref.Ask, host, port)
	return dest, r, true
}

// hold waits for a person's answer to a; a standing approval of its rule
// answers at once.
func (s *Server) hold(ctx context.Context, a egresspolicy.Ask) approval {
	id, err := newAskID()
	if err != nil {
		return approval{reason: err.Error()}
	}
	s.asks.mu.Lock()
	if by, ok := s.asks.standing[a.Rule]; ok {
		s.asks.mu.Unlock()
		return approval{allowed: true, by: by, reason: egresspolicy.ApprovedEarlier(by)}
	}
	if s.opts.OnAsk == nil {
		s.asks.mu.Unlock()
		return approval{reason: fmt.Sprintf("ask rule %q matches it, but nobody is asked for this run", a.Rule)}
	}
	a.ID = id
	h := &heldAsk{rule: a.Rule, answer: make(chan answered, 1)}
	s.asks.pending[id] = h
	s.asks.mu.Unlock()
	defer func() {
		s.asks.mu.Lock()
		delete(s.asks.pending, id)
		s.asks.mu.Unlock()
	}()
	s.opts.OnAsk(a)
	ap := s.wait(ctx, id, h)
	if s.opts.OnAskSettled != nil {
		s.opts.OnAskSettled(egresspolicy.Answer{ID: id, Allow: ap.allowed, By: ap.by})
	}
	return ap
}

// wait is the answer h gets, or why it got none.
func (s *Server) wait(ctx context.Context, id string, h *heldAsk) approval {
	timeout := s.approvalTimeout()
	timer := s.opts.Clock.NewTimer(timeout)
	defer timer.Stop()
	select {
	case ans := <-h.answer:
		switch {
		case !ans.Allow:
			return approval{id: id, by: ans.By, reason: egresspolicy.Denied(ans.By)}
		case ans.earlier:
			return approval{allowed: true, id: id, by: ans.By, reason: egresspolicy.ApprovedEarlier(ans.By)}
		}
		return approval{allowed: true, id: id, by: ans.By, reason: egresspolicy.Approved(ans.By)}
	case <-timer.Chan():
		return approval{id: id, by: egresspolicy.ByTimeout, reason: egresspolicy.NotApprovedWithin(timeout)}
	case <-ctx.Done():
		return approval{id: id, reason: "the request ended before anyone answered"}
	case <-s.asks.closing:
		return approval{id: id, reason: "the run ended before anyone answered"}
	}
}

// Answer decides the held request a.ID names. A standing allow also
// releases the other requests its ask rule holds, and lets every later one
// pass at once. An id no request is held for (answered, timed out, never
// asked) is an error, and nothing is released.
func (s *Server) Answer(a egresspolicy.Answer) error {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	h, ok := s.asks.pending[a.ID]
	if !ok {
		return fmt.Errorf("no request is held for ask %q (answered already, timed out, or never asked)", a.ID)
	}
	delete(s.asks.pending, a.ID)
	h.answer <- answered{Answer: a}
	if !a.Allow || !a.Standing {
		return nil
	}
	s.asks.standing[h.rule] = a.By
	for id, other := range s.asks.pending {
		if other.rule == h.rule {
			delete(s.asks.pending, id)
			other.answer <- answered{Answer: egresspolicy.Answer{ID: id, Allow: true, Standing: true, By: a.By}, earlier: true}
		}
	}
	return nil
}
