// Package intake is berth's front door: it runs the chat connectors, keeps
// the messages they accept in intake.db until the scheduler has them, and
// sends the agents' replies back through the connector each message came from.
//
// A message travels like this:
//
//	platform event ─▶ connector ─▶ Sink.Accept ─▶ route, dedup ─▶ inbox (fsynced) ─▶ event acknowledged
//	POST /hooks/{connector} (webhook) ─▶ inbox (fsynced) ─▶ 202 {"id"}
//	inbox pending ─▶ forwarder (one worker per connector, up to 64 Submits in flight) ─▶ dev.berth.Scheduler1.Submit ─▶ inbox submitted (run_id)
//	dev.berth.Intake1.Deliver ─▶ outbox (fsynced) ─▶ return
//	outbox pending ─▶ deliverer (one worker per connector) ─▶ Connector.Send / POST reply_url ─▶ outbox delivered | failed
//
// Every hand-off is persist-then-acknowledge and every retry is keyed (the
// scheduler's idempotency key is "<connector>/<message id>", the outbox's is
// the run id), so a crash anywhere loses nothing and runs nothing twice.
// Each connector has its own forward and reply worker, so a platform (or a
// Submit) that never answers holds up only its own connector.
//
// # Commits
//
// Every write to intake.db goes through one group committer (boltstore.Committer):
// writes that arrive while a commit is on its way to disk share the next
// transaction and its fsync, and each caller (a webhook POST, a platform
// event, a Deliver, a submitted mark) returns only after the commit that
// holds its write; a failed commit fails every write it held. There is no
// batching timer: a lone write is committed at once. A message costs one
// shared commit to be accepted and one to be marked submitted. A failed
// Submit writes nothing: its attempts and error are kept in memory (a
// restart tries every pending message at once); when no Submit of a pass
// gets through, the connector's worker pauses with back-off and starts
// again at its oldest message, so a scheduler that is down costs no fsync
// and a pass reads only the few messages it tries. The forwarder keeps up
// to 64 Submits in flight per connector, across agents: one agent's messages
// are handed on one at a time, in arrival order, and none overtakes one that
// waits for a retry, so the scheduler queues them as they came. A Submit that
// can never succeed (the scheduler's InvalidArgument, the bus refusing the
// arguments, a string D-Bus cannot carry) refuses the message and queues an
// error reply; a reply the platform refuses for good is marked failed.
//
// # Connectors
//
// Each [[connectors]] entry is built by the factory registered for its type
// (WithConnectorFactory; webhook is built in). Intake runs each connector's
// Run in its own goroutine with the Service as its Sink, serves its
// HTTPReceiver handler at /hooks/{id}, and rebuilds it on Reload when its
// entry changed. While a run is in progress, connectors that are Typers are
// asked to show "typing" when the message is handed on and every 8 s until
// the reply arrives (at most 10 min). Their Status is the Connectors property
// of dev.berth.Intake1, with every connector's credentials scrubbed.
//
// # Signing
//
// Webhook requests and reply posts carry two headers:
//
//	X-Berth-Timestamp: <unix seconds>
//	X-Berth-Signature: sha256=<hex of HMAC-SHA256(secret, timestamp + "." + raw body)>
//
// The timestamp is inside the signed bytes: that is what lets the five-minute
// window stop replays. A captured request cannot be re-sent later with a fresh
// timestamp without the secret, and the original timestamp goes stale after
// five minutes (inside the window, a replay of a message with an id is
// absorbed by the inbox's de-duplication). Signatures are compared in constant
// time.
//
// # Store
//
// intake.db (bbolt) holds:
//
//	meta
//	╰── version : uint64, big-endian (the schema version; written by boltstore)
//	inbox
//	├── messages
//	│   ╰── <connector>/<message id> : JSON inboxEntry
//	│         connector, id, channel, channel_name, server, thread, author,
//	│         text, meta, agent, received_at, state (pending|submitted|refused),
//	│         run_id, attempts (Submits it took, written when it ends),
//	│         last_error (why it was refused), done_at, seq,
//	│         progress_message
//	├── pending
//	│   ╰── <connector> NUL <seq: uint64, big-endian> : <connector>/<message id>
//	╰── done
//	    ╰── <done_at: unix ns, uint64 big-endian><seq: uint64 big-endian> : <connector>/<message id>
//	outbox
//	├── replies
//	│   ╰── <run id> : JSON outboxEntry
//	│         run_id, message_id, connector, agent, channel, thread, meta,
//	│         run_state, text, error, state (pending|delivered|failed),
//	│         attempts, last_error, next_attempt, delivered_at, done_at, seq,
//	│         files_dir, files (name, type, caption, size: the reply's
//	│         uploads, kept under reply-files/files_dir; replyfiles.go)
//	├── pending
//	│   ╰── <connector> NUL <seq: uint64, big-endian> : <run id>
//	╰── done
//	    ╰── <done_at: unix ns, uint64 big-endian><seq: uint64 big-endian> : <run id>
//	progress (created by the first progress message; no schema change)
//	╰── <connector>/<message id> : the platform id of its progress message,
//	      until it is deleted (progress_store.go): a restart deletes the
//	      ones whose answer is posted
//	sessions (created by the first save; no schema change)
//	╰── <connector> : the gateway session the connector keeps (Discord: JSON
//	      session_id, resume_gateway_url, seq, bot_user_id), so that a
//	      restart resumes it and the platform replays what it missed
//
// The pending buckets are indexes in arrival order, one key range per
// connector: each connector's worker reads only its own range, never every
// message ever received; their sizes are counted once at open and then kept
// in memory. Schema version 2 added the done indexes and the connector
// prefix. An entry leaves its pending index
// and enters its done index in the same transaction that marks it
// submitted, refused, delivered or failed. A message's inbox entry is also
// its de-duplication record: finished entries are kept for [retention]
// delivered_hours (default 72, at least 24) so that a platform's retry still
// runs nothing twice, then pruned from the done index's oldest end, at most
// 256 per transaction, every hour.
package intake
