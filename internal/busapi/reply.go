package busapi

import "strings"

// Reply is a finished run's answer for the connector its message came from
// (dev.berth.Intake1.Deliver).
type Reply struct {
	RunID string // the idempotency key: delivering it again stores nothing
	// MessageID is the platform's id of the message answered.
	MessageID string
	Connector string
	Agent     string
	Channel   string
	Thread    string
	State     string // the run's state: succeeded, failed, canceled
	Text      string
	Error     string
	// Traceparent is the W3C trace context of the scheduler's delivery
	// (internal/tracing), "" when tracing is off.
	Traceparent string
	// Question, when set, makes the reply an approval's question (the
	// scheduler asking in the conversation): Deliver's approval_id,
	// approval_what and approval_choices keys.
	Question *Question
	// Files are the uploads the reply carries (at most MaxFiles). They are
	// no part of Wire: they travel as descriptors, in DeliverFiles.
	Files []File
}

// Wire is the Deliver argument (a{ss}) for r. The message id travels as the
// scheduler's key for it, as it always has.
func (r Reply) Wire() map[string]string {
	m := map[string]string{
		"run_id":     r.RunID,
		"message_id": MessageKey(r.Connector, r.MessageID),
		"connector":  r.Connector,
		"agent":      r.Agent,
		"channel":    r.Channel,
		"thread":     r.Thread,
		"state":      r.State,
		"text":       r.Text,
		"error":      r.Error,
	}
	if r.Traceparent != "" {
		m["traceparent"] = r.Traceparent
	}
	if q := r.Question; q != nil {
		m["approval_id"] = q.ID
		m["approval_what"] = q.What
		m["approval_choices"] = strings.Join(q.Choices, ",")
	}
	return m
}

// Question is an approval a reply asks a person to decide: its id, what
// is asked, and the decisions a person in the chat may make (Decision…;
// none when the agent has no [[approvers]]: admins decide).
type Question struct {
	ID      string   `json:"id"`
	What    string   `json:"what"`
	Choices []string `json:"choices"`
}

// ReplyFromWire reads a Deliver argument.
func ReplyFromWire(m map[string]string) Reply {
	return Reply{
		RunID:     m["run_id"],
		MessageID: MessageIDOf(m["connector"], m["message_id"]),
		Connector: m["connector"],
		Agent:     m["agent"],
		Channel:   m["channel"],
		Thread:    m["thread"],
		State:     m["state"],
		Text:      m["text"],
		Error:     m["error"],

		Traceparent: m["traceparent"],
		Question:    questionFromWire(m),
	}
}

func questionFromWire(m map[string]string) *Question {
	id := m["approval_id"]
	if id == "" {
		return nil
	}
	q := &Question{ID: id, What: m["approval_what"]}
	for c := range strings.SplitSeq(m["approval_choices"], ",") {
		if c != "" {
			q.Choices = append(q.Choices, c)
		}
	}
	return q
}
