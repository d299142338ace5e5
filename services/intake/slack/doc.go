// Package slack connects berth-intake to a Slack workspace as a Slack app.
//
// It speaks two inbound transports, chosen by Options.Mode, and one outbound:
//
//   - Socket Mode ("socket"): apps.connections.open, called with the
//     app-level token (xapp-, scope connections:write), returns a one-time
//     WebSocket URL; Slack sends a "hello" frame, then envelopes
//     {"type":"events_api","envelope_id","payload","retry_attempt",
//     "retry_reason"} and "disconnect" frames (reason refresh_requested,
//     warning, link_disabled). Each envelope is acknowledged by writing
//     {"envelope_id": ...} back on the socket, and only after intake's
//     Sink.Accept returned nil: an unacknowledged envelope is delivered again
//     by Slack. The client is this package's own (gorilla/websocket; the
//     Web API calls through slack-go): slack-go's socketmode closes the old
//     connection before opening the new one when Slack asks for a refresh.
//     On disconnect refresh_requested or warning a fresh connection is
//     opened while the old one keeps delivering, and the old one is closed
//     once the new one said hello (Slack's order: nothing is missed, logged
//     at INFO). A dropped socket, a missing WebSocket ping for PingInterval
//     or link_disabled ends the connection; Run reconnects with a fresh URL
//     from apps.connections.open every time, capped exponential back-off
//     with jitter on the injected clock.
//   - The Events API over HTTP ("events"): intake serves Handler at
//     /hooks/{connector id}. Every request is verified before it is read as
//     JSON: X-Slack-Signature must be "v0=" + hex(HMAC-SHA256(signing secret,
//     "v0:" + X-Slack-Request-Timestamp + ":" + raw body)), compared in
//     constant time, and the timestamp must be within five minutes of the
//     clock. url_verification is answered with its challenge; event_callback
//     is handed to the Sink and answered 200 once Accept returned nil (500
//     otherwise, so that Slack retries with X-Slack-Retry-Num).
//   - Replies go out with chat.postMessage (bot token, xoxb-) in the thread
//     of the message they answer, split with connector.Split at 4,000
//     characters (Slack's advice for message text), honouring HTTP 429
//     Retry-After. Every chunk carries message metadata (event_type
//     "berth_reply", event_payload {run_id, chunk, chunks}); a Reply with
//     Retry set (intake attempted it before and never marked it delivered,
//     e.g. it crashed after the post) first reads the thread
//     (conversations.replies, or conversations.history outside a thread,
//     with include_all_metadata) and posts only the chunks not found there.
//
// Both transports carry the same Events API payload (an event_callback with
// a "message" or "app_mention" event), so both produce the same Message:
// ID is "channel:ts", the same for the message event and the app_mention
// event of one message and for every redelivery of it, so intake runs it
// once. Thread is thread_ts, or ts for a message outside a thread (the reply
// opens a thread under it). Server is the team id. The bot's own messages
// (auth.test's user_id and bot_id), other bots' messages (bot_id, subtype
// bot_message; unless AllowBots) and message subtypes that are not new user
// messages (message_changed, message_deleted, channel_join, ...) are ignored.
//
// Where the protocol was looked up: Slack's "Socket Mode implementation"
// and "Using Socket Mode" guides (api.slack.com/apis/connections/socket-implement,
// docs.slack.dev/apis/events-api/using-socket-mode), "Verifying requests from
// Slack" (docs.slack.dev/authentication/verifying-requests-from-slack), the
// Events API guide (url_verification, retries with X-Slack-Retry-Num and
// X-Slack-Retry-Reason), the method references of apps.connections.open,
// auth.test, chat.postMessage, conversations.replies and
// conversations.history (arguments, message metadata, errors, Tier rate
// limits and 429 Retry-After), and the code of slack-go's socketmode package.
// Package slacktest is a fake Slack speaking the same wire protocol.
package slack
