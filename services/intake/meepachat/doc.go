// Package meepachat connects berth-intake to a MeepaChat instance (hosted or
// self-hosted) as a bot: it holds the bot gateway WebSocket, hands every
// message.created event to intake's Sink and posts replies through the REST
// API.
//
// What is implemented, as MeepaChat documents it for bots (the "Bot Gateway"
// and "WebSocket" pages of the MeepaChat documentation, and the connectors
// MeepaChat publishes for other gateways in its own repository:
// openclaw/src/gateway.ts, openclaw/src/http-client.ts and the nanoclaw
// meepachat channel):
//
//   - Gateway: GET {base}/api/bot-gateway upgraded to a WebSocket, with
//     "Authorization: Bot <bot_id>.<secret>" (the deprecated ?token= query is
//     never used, so the token is in no URL). Every frame is
//     {"type": ..., "data": ...}. The server opens with ready (the bot user,
//     its servers with the channels it was added to, its dmChannels); the
//     connector sends subscribe {"channelIds": [...]} for all of them, and
//     again for channel.created and server.added. message.created is handed
//     on; message.updated, message.deleted, reaction.sync, typing and
//     presence events are ignored; unknown types are logged once each.
//   - Heartbeat: the server pings every 30 s and drops a client that has not
//     answered in 60 s; the WebSocket library answers pings while the
//     connector reads. The connector sends an application ping (answered by
//     pong) after 30 s without a frame, and takes 60 s without any frame as a
//     dead connection: it drops it and reconnects.
//   - Limits: the gateway reads at most 4,096 bytes per frame, so nothing
//     larger is ever sent (a subscribe for many channels is split across
//     frames). The documented limit is what the gateway reads; what it sends
//     (ready with every channel, a 4,000-character message with its user) is
//     larger, so inbound frames are refused only above Options.MaxFrameBytes
//     (1 MiB by default).
//   - Replies: POST {base}/api/servers/{server}/channels/{channel}/messages,
//     or POST {base}/api/dms/{channel}/messages for a DM, with
//     {"content", "threadId"} and the same Authorization header; answers are
//     {"data", "error"}. Replies are split at 4,000 characters with
//     connector.Split, posted in order, in the thread of the message.
//     HTTP 429 with Retry-After is waited out inside Send when short, else
//     returned as a *connector.RetryAfterError; chunks already posted are
//     not posted again when intake retries the same reply. 400, 403, 404,
//     410, 413 and 422 are *connector.PermanentError.
//   - Files: a reply's files go after its text, as MeepaChat's bot clients
//     send them: POST {base}/api/attachments/presign {"filename",
//     "mimeType"} → {uploadId}, PUT {base}/api/attachments/upload/{uploadId}
//     with a multipart "file" part, then a message with "attachmentIds",
//     at most 10 files a message, files over 25 MB left out with a note.
//   - Typing: {"type": "typing", "data": {"channelId"}} over the gateway.
//
// The protocol has no resume and no acknowledgements: a reconnect gets a
// fresh ready and subscribes again; events sent while no connection was up
// are not replayed by the server. A message.created counts as handled only
// once Sink.Accept returned nil: frames are handled one at a time, and when
// Accept fails the connector keeps the message, drops the connection and
// offers the message again first thing after reconnecting (back-off), so a
// refusal by intake loses nothing the connector has seen.
//
// Trigger "mention" (the default) hands on server-channel messages that
// mention the bot (its id in mentions, "<@id>" or "@username"); DMs always.
// As on Slack and Discord, the bot's leading mention and the whitespace
// around it are stripped, so "@berth /sh ls" reaches the agent as "/sh ls".
//
// Message.Server is the MeepaChat server id (bindings route on it; empty for
// DMs), Message.Thread the threadId (a reply to a message outside a thread
// goes to the channel), and Message.Meta carries "server" (the server id) or
// "dm"="true", which Send reads back from Reply.Meta.
package meepachat
