package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Approvals (issue 26, docs/adr/0031-approvals.md). A run's egress proxy
// holds a request an [agents.egress] ask rule matched and reports it
// (egresspolicy.Ask); the scheduler keeps it pending in scheduler.db, asks
// in the run's conversation, and answers the proxy when an admin decides
// (DecideApproval: berthctl approvals allow|deny) or when approval_timeout
// passes (denied, by "timeout"). The decision and who made it land in the
// run's egress record (the proxy's decision names them) and the journal.
// A pending approval whose run ends, or whose scheduler dies, is closed as
// ended: the retried attempt asks again.

var bucketApprovals = []byte("approvals")

// Approval states.
const (
	ApprovalPending = "pending"
	ApprovalAllowed = "allowed"
	ApprovalDenied  = "denied"
	ApprovalExpired = "expired" // approval_timeout passed: denied
	ApprovalEnded   = "ended"   // its run ended (or the scheduler died) first
)

// approvalRetention is how long decided approvals are kept.
const approvalRetention = 30 * 24 * time.Hour

// Approval is one ask, pending or decided.
type Approval = busapi.Approval

// liveAsk is a pending approval's way back to the proxy holding it.
type liveAsk struct {
	askID  string
	answer func(egresspolicy.Answer) error
	timer  interface{ Stop() bool }
}

// approvals are the pending asks of running runs.
type approvals struct {
	mu   sync.Mutex
	live map[string]liveAsk
}

func (a *approvals) take(id string) (liveAsk, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.live[id]
	delete(a.live, id)
	return l, ok
}

// onAsk is what a run's proxy calls with each ask (from its reader: it
// must not block). runOf is the run the proxy serves now (a conversation's
// sandbox serves one run after another); answer reaches the proxy again.
func (s *Service) onAsk(runOf func() Run, timeout time.Duration, answer func(egresspolicy.Answer) error) func(egresspolicy.Ask) {
	return func(a egresspolicy.Ask) {
		go s.asked(runOf(), timeout, a, answer)
	}
}

// onAskSettled is what the proxy calls when an ask ended: a pending
// approval whose request the proxy let go (its own deadline, the tool
// hung up, the run ended) is closed as expired or ended.
func (s *Service) onAskSettled(runOf func() Run) func(egresspolicy.Answer) {
	return func(a egresspolicy.Answer) {
		id := runOf().ID + "-" + approvalSuffix(a.ID)
		go func() {
			if live, ok := s.approvals.take(id); ok {
				live.timer.Stop()
				state := ApprovalEnded
				if a.By == egresspolicy.ByTimeout {
					state = ApprovalExpired
				}
				s.closeApproval(id, state)
			}
		}()
	}
}

// asked stores a pending approval, arms its timeout and asks in the
// run's conversation.
func (s *Service) asked(r Run, timeout time.Duration, a egresspolicy.Ask, answer func(egresspolicy.Answer) error) {
	now := s.clock.Now()
	ap := Approval{
		ID:        r.ID + "-" + approvalSuffix(a.ID),
		RunID:     r.ID,
		Agent:     r.Agent,
		Connector: r.Connector,
		Channel:   r.Channel,
		Thread:    r.Thread,
		MessageID: r.MessageID,
		What:      cleanText(a.What()),
		Rule:      cleanText(a.Rule),
		State:     ApprovalPending,
		AskedAt:   now,
		Deadline:  now.Add(timeout),
	}
	log := s.runLog(r).With("approval_id", ap.ID, "what", ap.What, "rule", ap.Rule)
	if err := s.putApproval(ap); err != nil {
		log.Error("cannot keep an approval; the request is denied", "err", err)
		answer(egresspolicy.Answer{ID: a.ID, By: "berth (the approval could not be stored)"})
		return
	}
	timer := s.clock.AfterFunc(timeout, func() { s.expire(ap.ID) })
	s.approvals.mu.Lock()
	if s.approvals.live == nil {
		s.approvals.live = map[string]liveAsk{}
	}
	s.approvals.live[ap.ID] = liveAsk{askID: a.ID, answer: answer, timer: timer}
	s.approvals.mu.Unlock()
	log.Info("approval asked", "deadline", ap.Deadline)
	s.askInConversation(r, ap)
}

// approvalSuffix is an ask id made safe for an approval id.
func approvalSuffix(id string) string {
	return strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			return c
		}
		return '_'
	}, id)
}

// askInConversation posts the question where the run's message came from
// (a reply of its own through intake); a run with no conversation (no
// connector) is asked of the admins only.
func (s *Service) askInConversation(r Run, ap Approval) {
	if s.opts.Deliverer == nil || r.Connector == "" {
		return
	}
	text := fmt.Sprintf("berth asks: may agent %s do %s (matched by ask rule %q)?\nAn admin decides with: berthctl approvals allow %s (or deny %s). Without an answer it is denied at %s.",
		ap.Agent, ap.What, ap.Rule, ap.ID, ap.ID, ap.Deadline.UTC().Format(time.RFC3339))
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	err := s.opts.Deliverer.Deliver(ctx, busapi.Reply{
		RunID: "ask-" + ap.ID, MessageID: busapi.MessageIDOf(r.Connector, r.MessageID), Connector: r.Connector,
		Agent: r.Agent, Channel: r.Channel, Thread: r.Thread, State: StateRunning, Text: text,
	})
	if err != nil {
		s.log.Warn("cannot ask in the conversation; admins still see the approval in berthctl approvals", "approval_id", ap.ID, "err", err)
	}
}

// DecideApproval answers a pending approval: allow (once, or standing for
// the rest of its run's proxy) or deny; by names the decider.
func (s *Service) DecideApproval(id string, allow, standing bool, by string) (Approval, error) {
	ap, ok, err := s.getApproval(id)
	if err != nil {
		return Approval{}, err
	}
	if !ok {
		return Approval{}, fmt.Errorf("%w: no approval %q", ErrNotFound, id)
	}
	if ap.State != ApprovalPending {
		return ap, fmt.Errorf("%w: approval %s is %s already (by %s)", ErrInvalidArgument, id, ap.State, cmp.Or(ap.By, "nobody"))
	}
	live, ok := s.approvals.take(id)
	if !ok {
		// Pending in the store but no proxy holds it: its run is gone.
		ap.State, ap.DecidedAt = ApprovalEnded, s.clock.Now()
		_ = s.putApproval(ap)
		return ap, fmt.Errorf("%w: the run that asked (%s) no longer waits for approval %s", ErrInvalidArgument, ap.RunID, id)
	}
	live.timer.Stop()
	ap.State, ap.Standing, ap.By, ap.DecidedAt = ApprovalDenied, false, by, s.clock.Now()
	if allow {
		ap.State, ap.Standing = ApprovalAllowed, standing
	}
	if err := s.putApproval(ap); err != nil {
		// The proxy is answered all the same: the decision is the admin's.
		s.log.Error("cannot record an approval's decision", "approval_id", id, "err", err)
	}
	if err := live.answer(egresspolicy.Answer{ID: live.askID, Allow: allow, Standing: ap.Standing, By: by}); err != nil {
		return ap, fmt.Errorf("cannot hand the decision to the run's egress proxy: %w", err)
	}
	s.log.Info("approval decided", "approval_id", id, "run_id", ap.RunID, "agent", ap.Agent, "what", ap.What, "state", ap.State, "standing", ap.Standing, "by", by)
	return ap, nil
}

// expire denies a pending approval whose approval_timeout passed.
func (s *Service) expire(id string) {
	live, ok := s.approvals.take(id)
	if !ok {
		return
	}
	ap, found, err := s.getApproval(id)
	if err == nil && found && ap.State == ApprovalPending {
		ap.State, ap.By, ap.DecidedAt = ApprovalExpired, "timeout", s.clock.Now()
		if err := s.putApproval(ap); err != nil {
			s.log.Error("cannot record an expired approval", "approval_id", id, "err", err)
		}
	}
	_ = live.answer(egresspolicy.Answer{ID: live.askID, By: "timeout"})
	s.log.Info("approval expired: denied", "approval_id", id, "run_id", ap.RunID, "what", ap.What)
}

// endApprovals closes the pending approvals of a run that ended.
func (s *Service) endApprovals(runID string) {
	s.approvals.mu.Lock()
	var ids []string
	for id, l := range s.approvals.live {
		if strings.HasPrefix(id, runID+"-") {
			l.timer.Stop()
			ids = append(ids, id)
			delete(s.approvals.live, id)
		}
	}
	s.approvals.mu.Unlock()
	for _, id := range ids {
		s.closeApproval(id, ApprovalEnded)
	}
}

func (s *Service) closeApproval(id, state string) {
	ap, ok, err := s.getApproval(id)
	if err != nil || !ok || ap.State != ApprovalPending {
		return
	}
	ap.State, ap.DecidedAt = state, s.clock.Now()
	if state == ApprovalExpired {
		ap.By = egresspolicy.ByTimeout
	}
	if err := s.putApproval(ap); err != nil {
		s.log.Error("cannot close an approval", "approval_id", id, "err", err)
	}
}

// closeOrphanedApprovals marks ended what a dead scheduler left pending:
// no proxy of this process holds them.
func (s *Service) closeOrphanedApprovals() error {
	list, err := s.ListApprovals(ApprovalPending)
	if err != nil {
		return err
	}
	for _, ap := range list {
		s.closeApproval(ap.ID, ApprovalEnded)
	}
	return nil
}

// ListApprovals is every approval in state ("" for all), newest first,
// decided ones older than approvalRetention pruned on the way.
func (s *Service) ListApprovals(state string) ([]Approval, error) {
	if state != "" && !slices.Contains([]string{ApprovalPending, ApprovalAllowed, ApprovalDenied, ApprovalExpired, ApprovalEnded}, state) {
		return nil, fmt.Errorf("%w: unknown approval state %q", ErrInvalidArgument, state)
	}
	var out []Approval
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketApprovals)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			var ap Approval
			if json.Unmarshal(v, &ap) == nil && (state == "" || ap.State == state) {
				out = append(out, ap)
			}
			return nil
		})
	})
	slices.SortFunc(out, func(a, b Approval) int { return b.AskedAt.Compare(a.AskedAt) })
	return out, err
}

func (s *Service) getApproval(id string) (Approval, bool, error) {
	var ap Approval
	var ok bool
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketApprovals)
		if b == nil {
			return nil
		}
		v := b.Get([]byte(id))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &ap)
	})
	return ap, ok, err
}

// putApproval stores ap (fsynced) and prunes decided approvals past
// their retention.
func (s *Service) putApproval(ap Approval) error {
	v, err := json.Marshal(ap)
	if err != nil {
		return err
	}
	cutoff := s.clock.Now().Add(-approvalRetention)
	return s.store.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketApprovals)
		if err != nil {
			return err
		}
		var old [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			var o Approval
			if json.Unmarshal(v, &o) == nil && o.State != ApprovalPending && o.DecidedAt.Before(cutoff) {
				old = append(old, slices.Clone(k))
			}
			return nil
		})
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put([]byte(ap.ID), v)
	})
}

// approvalTimeout is the agent's [agents.egress] approval_timeout.
func approvalTimeout(cfg *config.Config, agentID string) time.Duration {
	if a, err := cfg.Agent(agentID); err == nil && a.EgressApprovalTimeout > 0 {
		return a.EgressApprovalTimeout
	}
	return egresspolicy.DefaultApprovalTimeout
}
