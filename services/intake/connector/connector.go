// Package connector is the contract between berth-intake and the chat
// platforms it connects to (MeepaChat, Discord, Slack). A platform package
// turns the platform's events into Messages handed to a Sink, which persists
// them (fsync) before the platform is acknowledged, and posts Replies back in
// chunks the platform accepts. Intake owns storage, routing, deduplication,
// retries and the outbox; a platform package owns only the wire protocol.
package connector

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Message is one inbound chat message.
type Message struct {
	// Connector is the [[connectors]] id the message arrived on.
	Connector string
	// ID is the platform's id of the message (or event). Intake deduplicates
	// on (Connector, ID): a redelivered event with the same ID runs once.
	ID string
	// Channel is the platform's channel id; ChannelName its human name when
	// known (bindings may glob on it).
	Channel     string
	ChannelName string
	// Server is the MeepaChat server, Discord guild or Slack team id; bindings
	// may route on it.
	Server string
	// Thread is the platform's thread id, kept so the reply lands in it.
	Thread string
	Author string
	// AuthorID is the platform's stable id of the person who wrote it
	// (Slack U…, Discord's snowflake, MeepaChat's usr-…), never a name a
	// user can change, and "" for a bot: [[approvers]] name people by it.
	AuthorID string
	// AuthorGroups are the groups the author is in, as the platform says
	// (a Discord click's roles, "role:<id>"; Slack user groups,
	// "usergroup:<id>"); [[approvers]] may name one with its platform's
	// prefix ("discord:role:<id>", "slack:usergroup:<id>").
	AuthorGroups []string
	Text         string
	// Decision, when set, makes the message a person's answer to an
	// approval (a button's click or a keyword, approvals.go) from AuthorID:
	// it runs nothing, the scheduler decides and its answer is the reply.
	Decision *Decision
	// Meta is what the platform needs back to send the reply (a DM flag, an
	// interaction token, ...). It is stored with the message and returned in
	// Reply.Meta. It never holds connector credentials.
	Meta map[string]string
	// Files are the message's attachments as the platform announced them.
	// Intake downloads them (never the sandbox), caps them and stores them
	// with the message before Accept returns.
	Files []Attachment
}

// Attachment is one file on an inbound message.
type Attachment struct {
	// Name is the file's name as the platform gave it; Type its media type
	// ("" when the platform says none).
	Name string
	Type string
	// Size is the size the platform announced (0 when it did not): a file
	// announced over the cap is refused without a download.
	Size int64
	// URL is where intake downloads it (an AttachmentFetcher adds the
	// connector's credentials); Data holds the bytes instead when the
	// message carried them itself (a webhook's base64).
	URL  string
	Data []byte
}

// AttachmentFetcher is implemented by connectors whose attachment URLs need
// the connector's credentials (Slack's url_private). The request it returns
// is sent by intake with its own deadline and size cap; it must refuse a URL
// outside the platform's own hosts rather than send credentials there.
type AttachmentFetcher interface {
	AttachmentRequest(ctx context.Context, a Attachment) (*http.Request, error)
}

// Sink accepts inbound messages for intake.
type Sink interface {
	// Accept returns nil once m is durably stored (fsynced), or was stored
	// before (a duplicate), or was refused for good and logged (unroutable):
	// in all three cases the platform may be acknowledged and must not
	// redeliver. A non-nil error means nothing was stored and the event must
	// not be acknowledged (the platform will redeliver it, or the connection
	// should be dropped so that it does).
	Accept(ctx context.Context, m Message) error
}

// Reply is an agent's answer (or a failed run's error text) to one Message.
type Reply struct {
	RunID     string
	MessageID string // Message.ID it answers
	Channel   string
	Thread    string
	Text      string // what to post; for a failed run the error text intake wrote
	Failed    bool
	Meta      map[string]string // Message.Meta of the message it answers
	// Retry says an earlier attempt may have posted this reply: intake tried
	// it before and never marked it delivered (it may have crashed between
	// the post and the mark). A RepostChecker looks on the platform first.
	Retry bool
	// Question, when set, makes the reply an approval's question: a
	// platform with buttons shows one per choice below Text.
	Question *Question
	// Files are the uploads the reply carries, in order, after its text.
	// A connector sends those within its platform's limits (FitFiles) and
	// says in the text which it left out (WithNotes).
	Files []File
}

// RepostChecker is implemented by connectors that, for a Reply with Retry
// set, look on the platform for what an earlier attempt posted and post
// only what is missing (Slack: message metadata in the thread). Intake
// records the first attempt of a reply durably before Send for them, so that
// a crash between the post and its delivered mark still makes a Retry.
type RepostChecker interface {
	ChecksReposts() bool
}

// Connector is one configured platform connection. Intake calls Run once
// (in its own goroutine), Send from its per-connector outbox worker (one Send
// at a time per connector), and Status whenever it is asked.
type Connector interface {
	// Run holds the platform connection until ctx ends, reconnecting with
	// capped exponential back-off and jitter. It returns nil when ctx ends.
	// HTTP-only connectors return nil at once.
	Run(ctx context.Context, sink Sink) error
	// Send posts r, split into chunks within the platform's limit (Split),
	// honouring the platform's rate limits. It returns a *PermanentError when
	// the platform refuses for good (channel gone, bot removed), a
	// *RetryAfterError when the platform asked to wait, any other error for a
	// transient failure. Every call has a deadline (ctx and the client's).
	Send(ctx context.Context, r Reply) error
	// Status is the connection's state for `berthctl status`.
	Status() Status
}

// HTTPReceiver is implemented by connectors that also receive over HTTP on
// intake's socket-activated listener (Discord interactions, Slack's Events
// API). Intake serves the handler at /hooks/{connector id}.
type HTTPReceiver interface {
	Handler(sink Sink) http.Handler
}

// StatusWatcher is implemented by connectors that can say when their Status
// changes (StatusKeeper.Watch), so that intake publishes a change at once
// rather than on its deliver loop's next pass.
type StatusWatcher interface {
	// WatchStatus returns the current Status and a channel closed at the
	// next change.
	WatchStatus() (Status, <-chan struct{})
}

// LongLived is implemented by connectors whose Run holds a connection open
// (WebSocket gateways): while one is configured intake does not exit idle.
type LongLived interface {
	LongLived() bool
}

// Typer is implemented by connectors that can show "typing" while a run is
// in progress; intake calls it (best effort) for messages it has handed on.
type Typer interface {
	Typing(ctx context.Context, channel string, meta map[string]string) error
}

// Connection states.
const (
	StateConnecting   = "connecting"
	StateConnected    = "connected"
	StateDisconnected = "disconnected" // waiting to reconnect; LastError says why
	StateHTTP         = "http"         // HTTP-only: nothing to hold open
	StateStopped      = "stopped"
)

// Status is one connector's state as `berthctl status` and the Intake1
// Connectors property show it.
type Status struct {
	Type           string
	State          string
	ConnectedSince time.Time // zero unless connected
	LastEvent      time.Time // last inbound event of any kind
	LastError      string    // never holds a credential; "" once healthy again
	LastErrorAt    time.Time // when LastError happened; zero with it
	// Reconnects counts connection attempts after the first, whether or not
	// any succeeded (StatusKeeper keeps it).
	Reconnects int
	// Warning is a standing problem an admin must fix, e.g. Discord's
	// MESSAGE_CONTENT intent not granted (messages arrive empty).
	Warning string
}

// PermanentError is a reply the platform refuses for good; it is marked
// failed with Reason and never retried.
type PermanentError struct {
	Reason string
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %v", e.Reason, e.Err)
	}
	return e.Reason
}

func (e *PermanentError) Unwrap() error { return e.Err }

// RetryAfterError is a platform's request to wait (HTTP 429 Retry-After)
// before the next call; the reply is kept and sent again after After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("rate limited, retry after %s: %v", e.After, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// IsPermanent reports whether err carries a *PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// RetryAfter returns the wait a *RetryAfterError in err's chain asks for.
func RetryAfter(err error) (time.Duration, bool) {
	var re *RetryAfterError
	if errors.As(err, &re) {
		return re.After, true
	}
	return 0, false
}

// MetaServer is the Reply.Meta key under which intake gives back the
// Message.Server of the message a reply answers (unless Meta set it).
const MetaServer = "server"
