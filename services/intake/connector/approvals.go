package connector

import (
	"regexp"
	"strings"

	"github.com/berth-dev/berth/internal/busapi"
)

// Approvals asked in the chat (issue 26, docs/adr/0032-approvals-in-the-chat.md).
// The scheduler asks a question as a Reply with Question set; a platform
// that has buttons (Slack Block Kit, Discord components) shows one per
// Choice, the others show Text, which names the keywords. A person's answer
// comes back as a Message with Decision set: a button's click (its value is
// ChoiceValue) or a keyword message (ParseDecision). Intake stores it like
// any message and hands it to the scheduler, which decides only if the
// person is one of the agent's [[approvers]]: a platform package never
// decides anything, it only says who clicked what.

// Question is an approval a reply asks for: its id, what is asked ("POST
// api.stripe.com:443/v1/charges", as a person reads it) and the decisions
// offered, in order. It is the scheduler's, as Deliver carries it.
type Question = busapi.Question

// Decisions a person can make: the scheduler's (busapi.Decision…).
const (
	DecideAllowOnce         = busapi.DecisionAllowOnce
	DecideAllowConversation = busapi.DecisionAllowConversation
	DecideDeny              = busapi.DecisionDeny
)

// ChoiceLabel is a decision as a button says it.
func ChoiceLabel(decision string) string {
	switch decision {
	case DecideAllowOnce:
		return "Allow once"
	case DecideAllowConversation:
		return "Allow for this conversation"
	case DecideDeny:
		return "Deny"
	}
	return decision
}

// Decision is a person's answer to a Question.
type Decision struct {
	ApprovalID string `json:"approval_id"`
	Decision   string `json:"decision"` // one of the Decide constants
}

// choicePrefix starts every button value berth makes, so that a click on
// something else is never read as a decision.
const choicePrefix = "berth-approval:"

// ChoiceValue is the value (Slack) or custom id (Discord) of the button for
// decision on approval id: at most 100 bytes for approval ids berth makes.
func ChoiceValue(id, decision string) string {
	return choicePrefix + decision + ":" + id
}

// ParseChoice reads a button value ChoiceValue made; ok is false for any
// other value.
func ParseChoice(value string) (Decision, bool) {
	rest, ok := strings.CutPrefix(value, choicePrefix)
	if !ok {
		return Decision{}, false
	}
	decision, id, ok := strings.Cut(rest, ":")
	if !ok || !validDecision(decision) || !approvalIDRE.MatchString(id) {
		return Decision{}, false
	}
	return Decision{ApprovalID: id, Decision: decision}, true
}

func validDecision(d string) bool {
	return d == DecideAllowOnce || d == DecideAllowConversation || d == DecideDeny
}

// approvalIDRE is what an approval id is made of (a run id, "-", the
// proxy's ask id made safe): nothing a platform could mark up.
var approvalIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)

// keywordRE is a decision typed as a message: "approve ID", "approve ID
// for conversation", "deny ID" (case-insensitive), alone in the message.
// ID must have the shape of the approval ids the scheduler makes (its run
// id, "-", the ask's id), so that "allow everything" or "deny it" stays a
// message for the agent.
var keywordRE = regexp.MustCompile(`(?i)^(approve|allow|deny)\s+(\d{8}T\d{6}_\d{9}_[0-9a-f]{10}-[A-Za-z0-9_-]{1,40})(\s+for\s+(?:the\s+|this\s+)?conversation)?\s*$`)

// ParseDecision reads a keyword decision from a message's text (a bot
// mention already taken off); ok is false for any other text, which is an
// ordinary message for the agent.
func ParseDecision(text string) (Decision, bool) {
	m := keywordRE.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return Decision{}, false
	}
	d := Decision{ApprovalID: m[2], Decision: DecideAllowOnce}
	switch {
	case strings.EqualFold(m[1], "deny"):
		if m[3] != "" {
			return Decision{}, false // "deny for conversation" is not offered
		}
		d.Decision = DecideDeny
	case m[3] != "":
		d.Decision = DecideAllowConversation
	}
	return d, true
}

// Reply.Meta keys of a decision's reply (intake sets MetaDecided; a
// platform package sets MetaQuestion on the click): a platform that can
// edit its messages turns the question into the decision, without its
// buttons, instead of posting the decision beside it.
const (
	// MetaQuestion is the platform's id of the question message clicked.
	MetaQuestion = "question_message"
	// MetaDecided is "true" on the reply of a decision the scheduler made
	// (not on a refusal: the question keeps its buttons then).
	MetaDecided = "decided"
)
