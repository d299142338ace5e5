// Package intake is berth's front door: it accepts chat messages from
// connectors, keeps them in intake.db until the scheduler has them, and posts
// the agents' replies back to the platforms.
//
// A message travels like this:
//
//	POST /hooks/{connector} ─▶ inbox (fsynced) ─▶ 202 {"id"}
//	inbox pending ─▶ forwarder ─▶ dev.berth.Scheduler1.Submit ─▶ inbox submitted (run_id)
//	dev.berth.Intake1.Deliver ─▶ outbox (fsynced) ─▶ return
//	outbox pending ─▶ deliverer ─▶ POST reply_url (signed) ─▶ 2xx ─▶ outbox delivered
//
// Every hand-off is persist-then-acknowledge and every retry is keyed (the
// scheduler's idempotency key is "<connector>/<message id>", the outbox's is
// the run id), so a crash anywhere loses nothing and runs nothing twice.
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
//	╰── schema_version : uint64, big-endian
//	inbox
//	├── messages
//	│   ╰── <connector>/<message id> : JSON inboxEntry
//	│         connector, id, channel, channel_name, thread, author, text,
//	│         agent, received_at, state (pending|submitted), run_id,
//	│         attempts, last_error, seq
//	╰── pending
//	    ╰── <seq: uint64, big-endian> : <connector>/<message id>
//	outbox
//	├── replies
//	│   ╰── <run id> : JSON outboxEntry
//	│         run_id, message_id, connector, agent, channel, thread,
//	│         run_state, text, error, state (pending|delivered), attempts,
//	│         last_error, next_attempt, delivered_at, seq
//	╰── pending
//	    ╰── <seq: uint64, big-endian> : <run id>
//
// The pending buckets are indexes in arrival order: the loops read them
// instead of scanning every message ever received. An entry leaves its pending
// index in the same transaction that marks it submitted or delivered. Accepted
// messages and stored replies are kept so that repeated ids stay idempotent.
package intake
