package connector

import (
	"context"
	"fmt"
	"time"
)

// Live progress and reactions (docs/adr/0027-live-progress.md). A platform
// package implements what its API can do; intake decides when, per
// [connectors] progress and reactions, and holds every call to the
// platform's limits (ProgressLimits).

// ProgressMessage is the one message that shows a run's progress in the
// conversation of the message it answers. It is addressed like the Reply
// that follows it (Channel, Thread, Meta), so that later kinds of bot
// messages (a file's caption, an approval's buttons) can be added beside
// Text without changing how a message is placed.
type ProgressMessage struct {
	// ID is the platform's id of the progress message, once posted.
	ID string
	// MessageID is the Message.ID of the message the run answers.
	MessageID string
	Channel   string
	Thread    string
	Meta      map[string]string
	// Text is what it says now; at most ProgressLimits.MaxText bytes.
	Text string
}

// ProgressLimits is how a platform's progress message may be changed.
type ProgressLimits struct {
	// Every is the shortest time between two calls about one progress
	// message (post, edits, delete): within the platform's per-channel
	// rate limit, with room left for the reply itself.
	Every time.Duration
	// MaxText is the longest text, in bytes.
	MaxText int
}

// ProgressEditor is implemented by connectors that can post a message and
// edit it in place (Slack chat.update, Discord's message edit). The reply
// is posted as usual (Send, with its own protection against doubles), and
// the progress message is deleted once it is.
type ProgressEditor interface {
	// PostProgress posts p.Text and returns the new message's id.
	PostProgress(ctx context.Context, p ProgressMessage) (string, error)
	// EditProgress changes the text of the message p.ID to p.Text.
	EditProgress(ctx context.Context, p ProgressMessage) error
	// DeleteProgress deletes the message p.ID; one already gone is not an
	// error.
	DeleteProgress(ctx context.Context, p ProgressMessage) error
	ProgressLimits() ProgressLimits
}

// Reaction statuses: what intake marks a message with.
const (
	ReactionAccepted  = "accepted"  // 👀 the message was handed to its agent
	ReactionSucceeded = "succeeded" // ✅ the run answered
	ReactionFailed    = "failed"    // ❌ the run failed
)

// Reaction is one status mark on an inbound message.
type Reaction struct {
	MessageID string // Message.ID
	Channel   string
	Meta      map[string]string // Message.Meta
	Status    string            // one of the Reaction* statuses
}

// Reactor is implemented by connectors that can react to a message with an
// emoji (Slack reactions.add, Discord's PUT reactions, MeepaChat's PUT
// reactions). Reacting again with the same emoji is not an error.
type Reactor interface {
	React(ctx context.Context, r Reaction) error
}

// NotPermittedError is a platform refusing a progress call or a reaction
// because the bot lacks a scope or permission (Slack missing_scope,
// Discord 403 Missing Permissions). Intake shows it in the connector's
// status, since the admin must grant Need or turn the feature off.
type NotPermittedError struct {
	What string // "reactions"
	Need string // what to grant, e.g. "the bot scope reactions:write"
	// Everywhere is true when the refusal holds for every channel (a
	// missing app scope), so intake stops asking until it restarts;
	// false when it may hold for one channel only (a Discord channel's
	// permission overwrites).
	Everywhere bool
	Err        error
}

func (e *NotPermittedError) Error() string {
	msg := fmt.Sprintf("%s: the bot lacks %s", e.What, e.Need)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *NotPermittedError) Unwrap() error { return e.Err }
