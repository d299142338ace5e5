package slack

import (
	"context"
	"errors"
	"strings"
	"time"

	slackapi "github.com/slack-go/slack"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Live progress and reactions (docs/adr/0027-live-progress.md) over the
// Web API: the progress message is chat.postMessage in the message's
// thread, edited with chat.update and removed with chat.delete (scope
// chat:write, which replies need anyway); reactions are reactions.add
// (scope reactions:write, which is why [connectors] reactions is off by
// default). Slack allows about one message call a second per channel, so
// intake keeps a progress message's calls progressEvery apart.

const progressEvery = time.Second

// reactionNames are Slack's emoji names for intake's reaction statuses.
var reactionNames = map[string]string{
	connector.ReactionAccepted:  "eyes",
	connector.ReactionSucceeded: "white_check_mark",
	connector.ReactionFailed:    "x",
}

// ProgressLimits implements connector.ProgressEditor.
func (c *Connector) ProgressLimits() connector.ProgressLimits {
	return connector.ProgressLimits{Every: progressEvery, MaxText: MessageLimit}
}

// PostProgress implements connector.ProgressEditor: the message's ts is its id.
func (c *Connector) PostProgress(ctx context.Context, p connector.ProgressMessage) (string, error) {
	if p.Channel == "" {
		return "", &connector.PermanentError{Reason: "the progress message has no Slack channel"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	opts := []slackapi.MsgOption{slackapi.MsgOptionText(p.Text, false)}
	if p.Thread != "" {
		opts = append(opts, slackapi.MsgOptionTS(p.Thread))
	}
	_, ts, err := c.api.PostMessageContext(ctx, p.Channel, opts...)
	if err != nil {
		return "", c.classifyProgress(err)
	}
	if ts == "" {
		return "", errors.New("slack answered the progress message without its ts")
	}
	return ts, nil
}

// EditProgress implements connector.ProgressEditor with chat.update.
func (c *Connector) EditProgress(ctx context.Context, p connector.ProgressMessage) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	_, _, _, err := c.api.UpdateMessageContext(ctx, p.Channel, p.ID, slackapi.MsgOptionText(p.Text, false))
	return c.classifyProgress(err)
}

// DeleteProgress implements connector.ProgressEditor with chat.delete.
func (c *Connector) DeleteProgress(ctx context.Context, p connector.ProgressMessage) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	_, _, err := c.api.DeleteMessageContext(ctx, p.Channel, p.ID)
	if slackError(err) == "message_not_found" {
		return nil // deleted already
	}
	return c.classifyProgress(err)
}

// React implements connector.Reactor with reactions.add. A message's id is
// "channel:ts" (inbound.go).
func (c *Connector) React(ctx context.Context, r connector.Reaction) error {
	name, ok := reactionNames[r.Status]
	if !ok {
		return errors.New("unknown reaction status " + r.Status)
	}
	channel, ts, ok := strings.Cut(r.MessageID, ":")
	if !ok || channel == "" || ts == "" {
		return &connector.PermanentError{Reason: "the reaction names no Slack message"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	err := c.api.AddReactionContext(ctx, name, slackapi.ItemRef{Channel: channel, Timestamp: ts})
	switch code := slackError(err); code {
	case "already_reacted":
		return nil
	case "missing_scope", "not_allowed_token_type":
		// The app's scopes hold for every channel: asking again is useless.
		return &connector.NotPermittedError{What: "reactions", Need: "the bot scope reactions:write", Everywhere: true, Err: errors.New("Slack answered " + code)}
	}
	return c.classifyProgress(err)
}

// classifyProgress is classify for calls other than a reply's post.
func (c *Connector) classifyProgress(err error) error {
	if err == nil {
		return nil
	}
	var rl *slackapi.RateLimitedError
	if errors.As(err, &rl) {
		return &connector.RetryAfterError{After: rl.RetryAfter, Err: errors.New("Slack rate-limited the call")}
	}
	return c.classify(err)
}

// slackError is the error code of a Slack API refusal, "" for any other error.
func slackError(err error) string {
	var se slackapi.SlackErrorResponse
	if errors.As(err, &se) {
		return se.Err
	}
	if err != nil {
		return err.Error()
	}
	return ""
}
