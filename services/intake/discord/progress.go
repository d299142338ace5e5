package discord

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Live progress and reactions (docs/adr/0027-live-progress.md) over
// Discord's REST API: a progress message is created (POST
// /channels/{id}/messages), edited (PATCH /channels/{id}/messages/{id}) and
// deleted (DELETE) in the message's thread or channel; reactions are PUT
// /channels/{id}/messages/{id}/reactions/{emoji}/@me. Every call goes
// through call, which honours Discord's rate-limit headers; intake keeps a
// message's calls at least progressEvery apart on top of that (Discord
// allows 5 message calls per 5 s per channel; the reply needs its share).

// progressEvery is the shortest time between two calls about one progress
// message.
const progressEvery = time.Second

// reactionEmoji are the emoji of intake's reaction statuses.
var reactionEmoji = map[string]string{
	connector.ReactionAccepted:  "👀",
	connector.ReactionSucceeded: "✅",
	connector.ReactionFailed:    "❌",
}

// ProgressLimits implements connector.ProgressEditor.
func (c *Connector) ProgressLimits() connector.ProgressLimits {
	return connector.ProgressLimits{Every: progressEvery, MaxText: MessageLimit}
}

// progressTarget is where p's message lives: the thread, else the channel.
// A slash command has no message of its own to keep beside its follow-ups.
func progressTarget(p connector.ProgressMessage) (string, error) {
	if p.Meta[MetaInteractionToken] != "" {
		return "", &connector.PermanentError{Reason: "a slash command shows \"thinking…\", not a progress message"}
	}
	target := p.Thread
	if target == "" {
		target = p.Channel
	}
	if target == "" {
		return "", &connector.PermanentError{Reason: "the progress message names no Discord channel"}
	}
	return target, nil
}

// PostProgress implements connector.ProgressEditor.
func (c *Connector) PostProgress(ctx context.Context, p connector.ProgressMessage) (string, error) {
	target, err := progressTarget(p)
	if err != nil {
		return "", err
	}
	body := map[string]any{"content": p.Text, "allowed_mentions": noMentions}
	data, err := c.call(ctx, http.MethodPost, "POST /channels/"+target+"/messages", "/channels/"+url.PathEscape(target)+"/messages", body, true)
	if err != nil {
		return "", err
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &created); err != nil || created.ID == "" {
		return "", errors.New("discord answered the progress message without its id")
	}
	return created.ID, nil
}

// EditProgress implements connector.ProgressEditor.
func (c *Connector) EditProgress(ctx context.Context, p connector.ProgressMessage) error {
	target, err := progressTarget(p)
	if err != nil {
		return err
	}
	body := map[string]any{"content": p.Text, "allowed_mentions": noMentions}
	_, err = c.call(ctx, http.MethodPatch, "PATCH /channels/"+target+"/messages",
		"/channels/"+url.PathEscape(target)+"/messages/"+url.PathEscape(p.ID), body, true)
	return err
}

// DeleteProgress implements connector.ProgressEditor.
func (c *Connector) DeleteProgress(ctx context.Context, p connector.ProgressMessage) error {
	target, err := progressTarget(p)
	if err != nil {
		return err
	}
	_, err = c.call(ctx, http.MethodDelete, "DELETE /channels/"+target+"/messages",
		"/channels/"+url.PathEscape(target)+"/messages/"+url.PathEscape(p.ID), nil, true)
	if isNotFound(err) {
		return nil // deleted already
	}
	return err
}

// React implements connector.Reactor.
func (c *Connector) React(ctx context.Context, r connector.Reaction) error {
	emoji, ok := reactionEmoji[r.Status]
	if !ok {
		return errors.New("unknown reaction status " + r.Status)
	}
	if r.Meta[MetaInteractionToken] != "" || strings.HasPrefix(r.MessageID, interactionIDPrefix) {
		return nil // a slash command or a click is no message to react to
	}
	channel := r.Meta[MetaReplyChannel]
	if channel == "" {
		channel = r.Channel
	}
	if channel == "" || r.MessageID == "" {
		return &connector.PermanentError{Reason: "the reaction names no Discord message"}
	}
	path := "/channels/" + url.PathEscape(channel) + "/messages/" + url.PathEscape(r.MessageID) + "/reactions/" + url.PathEscape(emoji) + "/@me"
	_, err := c.call(ctx, http.MethodPut, "PUT /channels/"+channel+"/messages/reactions", path, nil, true)
	if isForbidden(err) {
		// Permissions are per channel (overwrites), so another channel
		// may still take reactions.
		return &connector.NotPermittedError{What: "reactions", Need: "the Add Reactions and Read Message History permissions in channel " + channel, Err: err}
	}
	return err
}

// isForbidden tells a refusal with Discord's 403 (Missing Permissions,
// Missing Access).
func isForbidden(err error) bool {
	var pe *connector.PermanentError
	return errors.As(err, &pe) && strings.Contains(pe.Reason, ": 403 ")
}

// isNotFound tells a refusal with Discord's 404.
func isNotFound(err error) bool {
	var pe *connector.PermanentError
	return errors.As(err, &pe) && strings.Contains(pe.Reason, ": 404 ")
}
