package busapi

import (
	"errors"
	"strings"
)

// ErrInvalid wraps every reason a value read from the wire is refused.
var ErrInvalid = errors.New("invalid value")

// Submission is one message for an agent (dev.berth.Scheduler1.Submit).
type Submission struct {
	// MessageID is the platform's id of the message, unique per connector.
	MessageID   string
	Agent       string
	Connector   string
	Channel     string
	ChannelName string
	Thread      string
	Author      string
	Text        string
	// Traceparent is the W3C trace context of the message's hand-off
	// (internal/tracing), "" when tracing is off.
	Traceparent string
	// Files are the message's attachments (SubmitFiles); they are not in
	// Wire.
	Files []File

	// sentKey is the key a submission read from the wire was sent with:
	// older clients chose their own (an id without the connector's prefix),
	// and their retries must keep finding their runs.
	sentKey string
}

// Key is the scheduler's idempotency key of the message: the same key
// returns the same run.
func (s Submission) Key() string {
	if s.sentKey != "" {
		return s.sentKey
	}
	return MessageKey(s.Connector, s.MessageID)
}

// MessageKey is the idempotency key of connector's message id. Messages of
// different connectors may share an id, so the key carries the connector;
// on the wire the message id travels as this key (what intake always sent).
func MessageKey(connector, messageID string) string {
	if connector == "" {
		return messageID
	}
	return connector + "/" + messageID
}

// MessageIDOf undoes MessageKey: the platform's id of the message whose key
// is key. A key without the connector's prefix is the id itself.
func MessageIDOf(connector, key string) string {
	if connector == "" {
		return key
	}
	return strings.TrimPrefix(key, connector+"/")
}

// Wire is the Submit argument (a{ss}) for s.
func (s Submission) Wire() map[string]string {
	m := map[string]string{
		"id":           s.Key(),
		"agent":        s.Agent,
		"connector":    s.Connector,
		"channel":      s.Channel,
		"channel_name": s.ChannelName,
		"thread":       s.Thread,
		"author":       s.Author,
		"text":         s.Text,
	}
	if s.Traceparent != "" {
		m["traceparent"] = s.Traceparent
	}
	return m
}

// SubmissionFromWire reads a Submit argument; unknown keys are ignored, as
// they always were. The scheduler refuses one without id or agent.
func SubmissionFromWire(m map[string]string) Submission {
	return Submission{
		MessageID:   MessageIDOf(m["connector"], m["id"]),
		Agent:       m["agent"],
		Connector:   m["connector"],
		Channel:     m["channel"],
		ChannelName: m["channel_name"],
		Thread:      m["thread"],
		Author:      m["author"],
		Text:        m["text"],
		Traceparent: m["traceparent"],
		sentKey:     m["id"],
	}
}
