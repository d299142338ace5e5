package busapi

import (
	"context"
	"time"

	"github.com/godbus/dbus/v5"
)

// Approval is one request a run's egress proxy held for a person to decide
// (an [agents.egress] ask rule matched), as ListApprovals gives it.
type Approval struct {
	ID        string `json:"id"`
	RunID     string `json:"run_id"`
	Agent     string `json:"agent"`
	Connector string `json:"connector,omitempty"`
	Channel   string `json:"channel,omitempty"`
	Thread    string `json:"thread,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	// What is the request ("POST api.stripe.com:443/v1/charges"), Rule the
	// ask rule that matched.
	What string `json:"what"`
	Rule string `json:"rule"`
	// State is pending, allowed, denied, expired (approval_timeout passed)
	// or ended (its run ended first); Standing says an allow holds for the
	// rest of the run's proxy; By is who decided.
	State    string `json:"state"`
	Standing bool   `json:"standing,omitempty"`
	// Conversation says the allow holds for the conversation: later asks
	// of the same rule there are allowed without asking.
	Conversation bool      `json:"conversation,omitempty"`
	By           string    `json:"by,omitempty"`
	AskedAt      time.Time `json:"asked_at"`
	Deadline     time.Time `json:"deadline"`
	DecidedAt    time.Time `json:"decided_at,omitzero"`
}

// Wire is the approval as an a{sv} entry of ListApprovals.
func (a Approval) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":              dbus.MakeVariant(a.ID),
		"run_id":          dbus.MakeVariant(a.RunID),
		"agent":           dbus.MakeVariant(a.Agent),
		"connector":       dbus.MakeVariant(a.Connector),
		"channel":         dbus.MakeVariant(a.Channel),
		"thread":          dbus.MakeVariant(a.Thread),
		"message_id":      dbus.MakeVariant(a.MessageID),
		"what":            dbus.MakeVariant(a.What),
		"rule":            dbus.MakeVariant(a.Rule),
		"state":           dbus.MakeVariant(a.State),
		"standing":        dbus.MakeVariant(a.Standing),
		"conversation":    dbus.MakeVariant(a.Conversation),
		"by":              dbus.MakeVariant(a.By),
		"asked_at_usec":   usecVariant(a.AskedAt),
		"deadline_usec":   usecVariant(a.Deadline),
		"decided_at_usec": usecVariant(a.DecidedAt),
	}
}

// ApprovalFromWire reads one entry of ListApprovals.
func ApprovalFromWire(m map[string]dbus.Variant) (Approval, error) {
	var a Approval
	f := fields{m: m}
	f.str("id", &a.ID)
	f.str("run_id", &a.RunID)
	f.str("agent", &a.Agent)
	f.str("connector", &a.Connector)
	f.str("channel", &a.Channel)
	f.str("thread", &a.Thread)
	f.str("message_id", &a.MessageID)
	f.str("what", &a.What)
	f.str("rule", &a.Rule)
	f.str("state", &a.State)
	f.boolean("standing", &a.Standing)
	f.boolean("conversation", &a.Conversation)
	f.str("by", &a.By)
	f.usec("asked_at_usec", &a.AskedAt)
	f.usec("deadline_usec", &a.Deadline)
	f.usec("decided_at_usec", &a.DecidedAt)
	if f.err == nil && a.ID == "" {
		return Approval{}, invalid("an approval without an id")
	}
	return a, f.err
}

// Decisions DecideApproval takes.
const (
	DecisionAllowOnce     = "allow_once"
	DecisionAllowStanding = "allow_standing" // for the rest of the run's proxy (a conversation's sandbox: the conversation)
	// DecisionAllowConversation allows the rule's requests for the rest of
	// the run and for every later run of the same conversation (and agent),
	// remembered in scheduler.db across restarts.
	DecisionAllowConversation = "allow_conversation"
	DecisionDeny              = "deny"
)

// ListApprovals is every approval in state ("" for all), newest first.
func (s Scheduler) ListApprovals(ctx context.Context, state string) ([]Approval, error) {
	var raw []map[string]dbus.Variant
	if err := s.call(ctx, "ListApprovals", []any{state}, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, ApprovalFromWire)
}

// DecideApproval answers a pending approval with one of the Decision
// values and returns it as decided. Admins only; the decider is the
// caller, as the bus names it.
func (s Scheduler) DecideApproval(ctx context.Context, id, decision string) (Approval, error) {
	var raw map[string]dbus.Variant
	if err := s.call(ctx, "DecideApproval", []any{id, decision}, &raw); err != nil {
		return Approval{}, err
	}
	return ApprovalFromWire(raw)
}

// DecideApprovalFor answers a pending approval for a person in the chat:
// approver is the platform-prefixed user id ("slack:U012345") intake read
// from the platform's signed event, groups the groups the same event puts
// them in ("discord:role:<id>"). The scheduler decides only if approver or
// one of groups is one of the approval's agent's [[approvers]]
// (bus.ErrAccessDenied otherwise). Intake's user only.
func (s Scheduler) DecideApprovalFor(ctx context.Context, id, decision, approver string, groups []string) (Approval, error) {
	var raw map[string]dbus.Variant
	if groups == nil {
		groups = []string{}
	}
	if err := s.call(ctx, "DecideApprovalFor", []any{id, decision, approver, groups}, &raw); err != nil {
		return Approval{}, err
	}
	return ApprovalFromWire(raw)
}
