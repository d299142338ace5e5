// Package discord connects berth-intake to Discord: a bot on the Gateway
// (WebSocket, API v10, JSON encoding) for guild and DM messages, the HTTP
// Interactions endpoint for slash commands, and REST (API v10) for replies.
//
// What it implements, and where it was looked up (discord/discord-api-docs:
// developers/events/gateway.mdx, developers/events/gateway-events.mdx,
// developers/topics/opcodes-and-status-codes.mdx, developers/topics/rate-limits.mdx,
// developers/interactions/receiving-and-responding.mdx, developers/interactions/overview.mdx):
//
//   - GET /api/v10/gateway/bot gives the gateway URL, cached until a dial to it
//     fails (Options.GatewayURL overrides it); the connection adds
//     ?v=10&encoding=json. A resume whose resume_gateway_url cannot be reached
//     is tried again on the gateway URL.
//   - HELLO (op 10) → IDENTIFY (op 2) with intents GUILDS | GUILD_MESSAGES |
//     DIRECT_MESSAGES | MESSAGE_CONTENT, or RESUME (op 6) {token, session_id,
//     seq} on READY's resume_gateway_url after a drop; READY / RESUMED
//     dispatches; heartbeats (op 1) every heartbeat_interval, the first after a
//     random fraction of it; a missing HEARTBEAT_ACK (op 11) is a zombie
//     connection, closed with a non-1000 code so the session stays resumable;
//     op 1 from the server is answered at once; RECONNECT (op 7) resumes;
//     INVALID_SESSION (op 9) resumes when d is true, else identifies anew.
//   - Close codes 4004 and 4010–4014 cannot be fixed by reconnecting; they keep
//     the connector disconnected (at the back-off cap) with a Status warning
//     (4014: the MESSAGE_CONTENT intent is not enabled for the bot). 4007 and
//     4009 start a new session.
//   - MESSAGE_CREATE → connector.Message; GUILD_CREATE, CHANNEL_* and THREAD_*
//     keep a channel cache so a message in a thread carries its parent channel
//     (Channel, ChannelName) and the thread (Thread) the reply goes to.
//   - POST /api/v10/channels/{channel}/messages for replies (allowed_mentions
//     empty: an agent's text never pings @everyone; nonce and enforce_nonce),
//     GET /api/v10/channels/{channel} for a channel missing from the cache, and
//     POST /api/v10/webhooks/{application}/{interaction token} for follow-ups;
//     X-RateLimit-Remaining / X-RateLimit-Reset-After per route, 429 with
//     Retry-After (header, else the body's retry_after) and the global flag
//     (X-RateLimit-Global or the body's global).
//   - Interactions over HTTP: Ed25519 over X-Signature-Timestamp + raw body with
//     the application's public key (401 on any failure), PING (type 1) → PONG
//     (type 1), APPLICATION_COMMAND (type 2) → DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
//     (type 5) once the sink stored it; the run's reply is posted later as
//     follow-up messages with the interaction token kept in Message.Meta.
//   - Approvals (buttons.go, clicks.go; interactions/message-components.mdx):
//     a reply with a Question carries one action row of buttons below its
//     last chunk (custom_id connector.ChoiceValue, at most 100 characters);
//     a click, MESSAGE_COMPONENT (type 3) over the Interactions endpoint or
//     as INTERACTION_CREATE over the Gateway (sent there when the
//     application has no Interactions Endpoint URL; answered with POST
//     /interactions/{id}/{token}/callback within 3 s), becomes a Message
//     with ID "interaction:"+id, a Decision and AuthorID member.user.id (a
//     guild) or user.id (a DM). Only a button berth made (ParseChoice, and on
//     the clicked message as Discord sent it) clicked by a person decides;
//     it is acknowledged with DEFERRED_UPDATE_MESSAGE (type 6) once
//     sink.Accept returned nil, anything else gets an ephemeral note.
//
// # Why discordgo gives the types and not the session
//
// github.com/bwmarrin/discordgo (v0.29.0) supplies the wire types (Message,
// Channel, Guild, Interaction, the intent bits). Its Session is not used,
// because in v0.29.0 it stores an event's sequence number before the
// handlers run, so an event whose hand-off to the sink failed could never be
// replayed by RESUME; it does not use resume_gateway_url; its heartbeats,
// reconnect waits and rate-limit waits use the wall clock with no way to
// cancel them; it holds a bucket's lock across the HTTP call; a 429 loses the
// global flag and the Retry-After header; its endpoints are package-level
// variables (one base URL per process); and its errors quote request URLs,
// which for follow-ups contain the interaction token. So this package runs
// the Gateway loop and REST calls itself (github.com/coder/websocket for the
// WebSocket), each connector with its own base URL, clock and HTTP client.
//
// # Acknowledgement
//
// The Gateway has no per-event ack: a RESUME asks for every event after the
// sequence number it carries. The connector advances its sequence number for
// a MESSAGE_CREATE only after sink.Accept returned nil; when Accept fails it
// drops the connection (close code 4000, so the session stays resumable) and
// resumes from the last accepted event, so Discord replays the failed one
// with the same message ID.
//
// When the Sink is also a SessionStore (intake's Service, in intake.db), the
// session (id, resume_gateway_url, sequence number, the bot's user id) is
// kept after each event is handled, so a restarted intake RESUMEs and
// Discord replays what was sent while it was down; only INVALID_SESSION with
// d false (or close 4007/4009) starts a new session. The keeper writes in
// the background, the latest state only: what it wrote can lag behind (a
// replay of events already stored, which the inbox deduplicates) but never
// passes a message not yet stored. Stopping drops the connection without a
// close frame, since a close with 1000 or 1001 would end the session. A
// resumed session gets no GUILD_CREATE, so a guild channel missing from the
// cache is looked up with GET /channels/{id} (a thread's parent too).
//
// # Replies
//
// Send splits with connector.Split at 2,000 characters and posts the chunks
// in order; it remembers, per reply, how many chunks were posted, so a reply
// retried after a RetryAfterError or a transient failure does not repeat the
// chunks that already arrived. Each chunk is posted with a nonce (the run
// id, with ".<n>" after the first chunk, hashed to 25 characters when
// longer, as a scheduler run id is) and enforce_nonce, so a chunk posted
// again after a crash or a lost answer returns the message already made
// instead of a second one, for as long as Discord keeps the nonce (a few
// minutes). Follow-ups of slash commands take no nonce and may repeat.
//
// Package discordtest is the fake Discord the tests (and end-to-end tests)
// run this package against.
package discord
