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

// bucketGrants holds the allows made "for this conversation": key
// grantKey, value a grant. A later ask of the same rule in the same
// conversation and agent is allowed without asking, across restarts.
var bucketGrants = []byte("approval_grants")

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
	if g, ok := s.grantFor(r, a.Rule); ok {
		ap.State, ap.Standing, ap.Conversation = ApprovalAllowed, true, true
		ap.By, ap.DecidedAt = g.By+" (for this conversation)", now
		if err := s.putApproval(ap); err != nil {
			log.Error("cannot record an approval the conversation's allow decided", "err", err)
		}
		log.Info("approval allowed for this conversation earlier", "by", g.By, "granted_at", g.At)
		s.countApproval(ap.Agent, "remembered")
		if err := answer(egresspolicy.Answer{ID: a.ID, Allow: true, Standing: true, By: ap.By}); err != nil {
			log.Warn("cannot hand the conversation's allow to the run's egress proxy", "err", err)
		}
		return
	}
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
	s.countApproval(ap.Agent, "asked")
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
	text, q := questionOf(s.cfg.Load(), ap)
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	err := s.opts.Deliverer.Deliver(ctx, busapi.Reply{
		RunID: "ask-" + ap.ID, MessageID: busapi.MessageIDOf(r.Connector, r.MessageID), Connector: r.Connector,
		Agent: r.Agent, Channel: r.Channel, Thread: r.Thread, State: StateRunning, Text: text, Question: q,
	})
	if err != nil {
		s.log.Warn("cannot ask in the conversation; admins still see the approval in berthctl approvals", "approval_id", ap.ID, "err", err)
	}
}

// questionOf is the question asked in ap's conversation: its text, and
// the choices of a person in the chat when the agent has [[approvers]]
// (without, only admins decide, and the text says how).
func questionOf(cfg *config.Config, ap Approval) (string, *busapi.Question) {
	deadline := ap.Deadline.UTC().Format(time.RFC3339)
	if cfg == nil || !cfg.HasApprovers(ap.Agent) {
		return fmt.Sprintf("berth asks: may agent %s do %s (matched by ask rule %q)?\nAn admin decides with: berthctl approvals allow %s (or deny %s). Without an answer it is denied at %s.",
			ap.Agent, ap.What, ap.Rule, ap.ID, ap.ID, deadline), nil
	}
	text := fmt.Sprintf("berth asks: may agent %s do %s (matched by ask rule %q)?\nAn approver decides: reply `approve %s`, `approve %s for conversation` or `deny %s` (or use the buttons). Without an answer it is denied at %s.",
		ap.Agent, ap.What, ap.Rule, ap.ID, ap.ID, ap.ID, deadline)
	return text, &busapi.Question{ID: ap.ID, What: ap.What, Choices: []string{
		busapi.DecisionAllowOnce, busapi.DecisionAllowConversation, busapi.DecisionDeny}}
}

// decision is what a person decided.
type decision struct{ allow, standing, conversation bool }

// parseDecision reads a busapi Decision word.
func parseDecision(word string) (decision, error) {
	switch word {
	case busapi.DecisionAllowOnce:
		return decision{allow: true}, nil
	case busapi.DecisionAllowStanding:
		return decision{allow: true, standing: true}, nil
	case busapi.DecisionAllowConversation:
		return decision{allow: true, standing: true, conversation: true}, nil
	case busapi.DecisionDeny:
		return decision{}, nil
	}
	return decision{}, fmt.Errorf("%w: decision %q: want %s, %s, %s or %s", ErrInvalidArgument, word,
		busapi.DecisionAllowOnce, busapi.DecisionAllowStanding, busapi.DecisionAllowConversation, busapi.DecisionDeny)
}

// DecideApproval answers a pending approval: allow (once, or standing for
// the rest of its run's proxy) or deny; by names the decider.
func (s *Service) DecideApproval(id string, allow, standing bool, by string) (Approval, error) {
	return s.decide(id, decision{allow: allow, standing: allow && standing}, by)
}

// DecideApprovalFor answers a pending approval for a person in the chat
// (approver: "slack:U012345", as intake read it from the platform's
// signed event; groups: the groups the same event puts them in,
// "discord:role:<id>"): only one of the approval's agent's [[approvers]]
// may, by their id or a group. The decider is named by their id.
func (s *Service) DecideApprovalFor(id string, d decision, approver string, groups ...string) (Approval, error) {
	ap, ok, err := s.getApproval(id)
	if err != nil {
		return Approval{}, err
	}
	if !ok {
		return Approval{}, fmt.Errorf("%w: no approval %q", ErrNotFound, id)
	}
	if cfg := s.cfg.Load(); cfg == nil || !cfg.MayApprove(ap.Agent, approver, groups...) {
		s.log.Warn("approval decision refused: not an approver", "approval_id", id, "agent", ap.Agent, "user", approver)
		return ap, fmt.Errorf("%w: %s is not one of agent %s's approvers ([[approvers]]); approval %s is unchanged", ErrNotApprover, cmp.Or(approver, "an unknown user"), ap.Agent, id)
	}
	return s.decide(id, d, approver)
}

// decide answers a pending approval with d; by names the decider.
func (s *Service) decide(id string, d decision, by string) (Approval, error) {
	allow, standing := d.allow, d.standing
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
		ap.Conversation = d.conversation && ap.Connector != ""
	}
	if ap.Conversation {
		if err := s.putGrant(ap); err != nil {
			// Allowed all the same, for this run: later runs ask again.
			s.log.Error("cannot remember an allow for the conversation", "approval_id", id, "err", err)
			ap.Conversation = false
		}
	}
	if err := s.putApproval(ap); err != nil {
		// The proxy is answered all the same: the decision is the admin's.
		s.log.Error("cannot record an approval's decision", "approval_id", id, "err", err)
	}
	if err := live.answer(egresspolicy.Answer{ID: live.askID, Allow: allow, Standing: ap.Standing, By: by}); err != nil {
		return ap, fmt.Errorf("cannot hand the decision to the run's egress proxy: %w", err)
	}
	s.countApproval(ap.Agent, ap.State)
	s.log.Info("approval decided", "approval_id", id, "run_id", ap.RunID, "agent", ap.Agent, "what", ap.What, "state", ap.State, "standing", ap.Standing, "conversation", ap.Conversation, "by", by)
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
	s.countApproval(ap.Agent, ApprovalExpired)
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
	s.countApproval(ap.Agent, state)
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
	return s.putPruned(bucketApprovals, []byte(ap.ID), v, func(v []byte) bool {
		var o Approval
		return json.Unmarshal(v, &o) == nil && o.State != ApprovalPending && o.DecidedAt.Before(cutoff)
	})
}

// putPruned puts key in bucket (fsynced), deleting in the same commit the
// entries stale says are past their retention.
func (s *Service) putPruned(bucket, key, value []byte, stale func(v []byte) bool) error {
	return s.store.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		var old [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			if stale(v) {
				old = append(old, slices.Clone(k))
			}
			return nil
		})
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put(key, value)
	})
}

// approvalTimeout is the agent's [agents.egress] approval_timeout.
func approvalTimeout(cfg *config.Config, agentID string) time.Duration {
	if a, err := cfg.Agent(agentID); err == nil && a.EgressApprovalTimeout > 0 {
		return a.EgressApprovalTimeout
	}
	return egresspolicy.DefaultApprovalTimeout
}

// grant is an allow made for a conversation.
type grant struct {
	By         string    `json:"by"`
	ApprovalID string    `json:"approval_id"`
	At         time.Time `json:"at"`
}

// grantKey is the conversation, agent and ask rule a grant holds for.
func grantKey(agent, connector, channel, thread, rule string) []byte {
	return []byte(strings.Join([]string{agent, connector, channel, thread, rule}, "\x00"))
}

// grantFor is the conversation's allow of rule for r's agent, if any
// younger than approvalRetention.
func (s *Service) grantFor(r Run, rule string) (grant, bool) {
	if r.Connector == "" {
		return grant{}, false
	}
	var g grant
	var ok bool
	_ = s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGrants)
		if b == nil {
			return nil
		}
		v := b.Get(grantKey(r.Agent, r.Connector, r.Channel, r.Thread, rule))
		ok = v != nil && json.Unmarshal(v, &g) == nil && s.clock.Now().Sub(g.At) < approvalRetention
		return nil
	})
	return g, ok
}

// putGrant remembers ap's allow for its conversation (fsynced) and prunes
// grants past approvalRetention: a conversation idle that long asks again.
func (s *Service) putGrant(ap Approval) error {
	v, err := json.Marshal(grant{By: ap.By, ApprovalID: ap.ID, At: ap.DecidedAt})
	if err != nil {
		return err
	}
	cutoff := s.clock.Now().Add(-approvalRetention)
	return s.putPruned(bucketGrants, grantKey(ap.Agent, ap.Connector, ap.Channel, ap.Thread, ap.Rule), v, func(v []byte) bool {
		var g grant
		return json.Unmarshal(v, &g) != nil || g.At.Before(cutoff)
	})
}

// countApproval counts one approval's outcome for its agent (the label
// set is the config's agents and the outcomes above).
func (s *Service) countApproval(agent, outcome string) {
	if s.metrics != nil {
		s.metrics.approvals.WithLabelValues(agent, outcome).Inc()
	}
}
