package intake

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Approvals in the chat (issue 26, docs/adr/0032-approvals-in-the-chat.md).
// A person's answer to an approval's question — a button's click, which a
// platform package turns into a Message with Decision set, or a keyword
// message ("approve ID", connector.ParseDecision) — is stored like any
// message: acknowledged to the platform only once it is on disk, never
// run. The forwarder hands it to the scheduler's DecideApprovalFor with
// the platform-prefixed id of its author as the platform's signed event
// named them ("slack:U012345"); the scheduler decides only for the agent's
// [[approvers]], and what it answered (decided, or refused and why) is the
// reply, in the same conversation.

// Decider is a Submitter that also takes decisions (BusSubmitter is one).
type Decider interface {
	DecideApprovalFor(ctx context.Context, id, decision, approver string, groups []string) (busapi.Approval, error)
}

// DecideApprovalFor implements Decider.
func (b BusSubmitter) DecideApprovalFor(ctx context.Context, id, decision, approver string, groups []string) (busapi.Approval, error) {
	ap, err := busapi.NewScheduler(b.Conn).DecideApprovalFor(ctx, id, decision, approver, groups)
	if err != nil {
		return busapi.Approval{}, fmt.Errorf("cannot decide at %s: %w", bus.SchedulerName, err)
	}
	return ap, nil
}

// decisionOf is m's decision: the platform's (a click), else its text's
// keyword; nil for an ordinary message.
func decisionOf(m connector.Message) *connector.Decision {
	if m.Decision != nil {
		d := *m.Decision
		return &d
	}
	if d, ok := connector.ParseDecision(m.Text); ok {
		return &d
	}
	return nil
}

// approverOf is who made m's decision as [[approvers]] name people: the
// connector's type and the platform's user id of its author ("" when the
// platform named nobody: a bot), and the author's groups as
// "<type>:<kind>:<id>" ("discord:role:…", "slack:usergroup:…").
func (s *Service) approverOf(m inboxEntry) (string, []string) {
	if m.AuthorID == "" {
		return "", nil
	}
	c, ok := s.config().Connector(m.Connector)
	if !ok {
		return "", nil
	}
	var groups []string
	for _, g := range m.AuthorGroups {
		groups = append(groups, c.Type+":"+g)
	}
	return c.Type + ":" + m.AuthorID, groups
}

// errDecided is the cause recorded for a decision message: it was
// answered, never run.
var errDecided = errors.New("a decision on an approval, answered by the scheduler")

// forwardDecision hands m's decision to the scheduler and queues its
// answer as m's reply. A scheduler that is not there (or any error but a
// refusal) is retried like a Submit; a refusal (not an approver, decided
// already, no such approval) is the answer.
func (s *Service) forwardDecision(ctx context.Context, sub Submitter, m inboxEntry, lane *forwardLane, attempts int) bool {
	d, ok := sub.(Decider)
	if !ok {
		return s.answerDecision(m, lane, attempts, "Sorry, this berth's scheduler takes no decisions in the chat; an admin decides with berthctl approvals.", false)
	}
	approver, groups := s.approverOf(m)
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	ap, err := d.DecideApprovalFor(callCtx, m.Decision.ApprovalID, m.Decision.Decision, approver, groups)
	log := s.log.With("connector", m.Connector, "message_id", m.ID, "approval_id", m.Decision.ApprovalID, "decision", m.Decision.Decision, "approver", approver)
	if err != nil && !decisionRefused(err) {
		delay := s.retryDelay.Delay(attempts)
		log.Warn("scheduler did not take a decision; will retry", "attempts", attempts, "retry_in", delay, "err", err)
		lane.retry(m.Key(), m.Agent, attempts, s.clock.Now().Add(delay), err)
		return false
	}
	if err != nil {
		log.Info("decision refused", "err", dbusErrorText(err))
		return s.answerDecision(m, lane, attempts, "Not decided: "+dbusErrorText(err), false)
	}
	log.Info("decision made", "state", ap.State, "run_id", ap.RunID)
	return s.answerDecision(m, lane, attempts, decidedText(ap), true)
}

// decisionRefused reports whether the scheduler refused a decision for
// good: asking again gets the same answer.
func decisionRefused(err error) bool {
	switch bus.ErrorName(err) {
	case bus.ErrAccessDenied, bus.ErrNotFound, bus.ErrInvalidArgument:
		return true
	}
	return submitCanNeverSucceed(err)
}

// decidedText is the reply to a decision the scheduler made.
func decidedText(ap busapi.Approval) string {
	verb := "Denied"
	switch {
	case ap.State != "allowed":
	case ap.Conversation:
		verb = "Allowed for this conversation"
	case ap.Standing:
		verb = "Allowed for the rest of the run"
	default:
		verb = "Allowed once"
	}
	return fmt.Sprintf("%s by %s: %s (agent %s).", verb, ap.By, ap.What, ap.Agent)
}

// answerDecision records that m was answered, not run, and queues text as
// its reply, in one commit; decided says the scheduler made the decision
// (connector.MetaDecided).
func (s *Service) answerDecision(m inboxEntry, lane *forwardLane, attempts int, text string, decided bool) bool {
	key, now := m.Key(), s.clock.Now()
	meta := replyMeta(m)
	if decided {
		if meta == nil {
			meta = map[string]string{}
		}
		meta[connector.MetaDecided] = "true"
	}
	reply := outboxEntry{
		RunID:     "decided-" + key,
		MessageID: m.ID,
		Connector: m.Connector,
		Agent:     m.Agent,
		Channel:   m.Channel,
		Thread:    m.Thread,
		Meta:      meta,
		RunState:  "succeeded",
		Text:      bus.Text(strings.TrimSpace(text)),
	}
	if err := s.store.answerMessage(key, stateDecided, errDecided, reply, attempts, now); err != nil {
		s.log.Error("cannot record a decision's answer", "connector", m.Connector, "message_id", m.ID, "err", err)
		lane.retry(key, m.Agent, attempts, now.Add(s.retryDelay.Delay(attempts)), err)
		return false
	}
	lane.forget(key)
	s.countHandoff(m, "decided", now)
	s.refreshCounters()
	s.pokeDeliver(m.Connector)
	return true
}
