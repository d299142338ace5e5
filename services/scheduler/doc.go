// Package scheduler is berth-scheduler's logic: it accepts messages over
// D-Bus (dev.berth.Scheduler1.Submit), keeps them as runs in scheduler.db,
// runs each one through an isolation backend (one run per agent at a time,
// FIFO per agent, at most [scheduler] max_concurrent_runs in total; an agent
// with [agents.sandbox] scope = "conversation" runs one per conversation,
// each in its conversation's kept sandbox, sandboxes.go) and hands
// the reply to intake (dev.berth.Intake1.Deliver) until intake acknowledges it.
//
// Every hand-off is persist-then-acknowledge: Submit returns once the run is
// committed; a run is delivered until the Deliverer returns nil; a scheduler
// that crashed finds its running runs on the next start, kills what the
// backend left behind and runs them again (once).
//
// cmd/berth-scheduler wires it: New, Export, Run until a signal, Close.
//
// # Writes that share a commit
//
// The busy writes — Submit, the dispatcher's claim, a run's outcome, a
// delivery mark, CancelRun — go through one committer (boltstore.Committer):
// those that arrive while a commit is on its way to disk share the next
// transaction and its fsync, applied in the order the committer took them,
// and each caller returns only after the commit that holds it. A Submit
// looks its message id up before it inserts, so two Submits of one message
// in one commit give one run; a failed commit fails every write it held
// and stores none. Reconcile, quarantine and retention keep transactions of
// their own. The dispatcher remembers the queue per agent (queueview.go),
// so a pass reads only the entries added since the last one, however long
// a busy agent's line is. The D-Bus object remembers for a minute which
// connections it let submit (a unique bus name is never reused), so a
// stream of Submits costs no credentials round trip per message.
//
// # Faults it survives
//
// Run returns an error (and the daemon exits non-zero) when the store fails;
// the dispatcher passes at least every 5 s and LastProgress says when it last
// did, for the watchdog. A record that cannot be decoded is moved to
// quarantine/ and counted in the Quarantined property, never fatal. The
// service's mutex guards only in-memory state: no transaction, backend call
// or bus call happens under it, and every Backend.Kill has a deadline.
// Texts are made valid UTF-8 without NUL (cleanText) where they enter a run
// record, so every reply can cross D-Bus; one that still cannot be delivered
// ends as failed after a bounded number of attempts. Old runs and idle
// conversations are pruned in the background ([retention]) in transactions
// of at most 500 deletions.
//
// # scheduler.db
//
// One bbolt file, opened by this process only:
//
//	meta/
//	  version      → uint64 big-endian: schema version (see migrations)
//	runs/
//	  <run id>     → JSON Run record; run ids sort by creation time. Tool
//	                 outputs are cut to 16 KiB per call and 256 KiB per run
//	                 (output_cut, output_bytes); the reply is kept whole
//	summaries/     (schema version 3)
//	  <run id>     → JSON Summary: what ListRuns returns (previews, sizes)
//	by_state/      (schema version 3)
//	  <state> NUL <run id> → empty: runs by state, oldest first
//	by_agent/      (schema version 3)
//	  <agent> NUL <run id> → empty: runs by agent, oldest first
//	messages/
//	  <message id> → run id: the idempotency index of Submit
//	queue/         (NextSequence numbers it)
//	  <seq>        → run id, seq uint64 big-endian: queued runs in FIFO order;
//	                 a run keeps its seq, so a requeued run goes back to the
//	                 front of its agent's line
//	deliveries/
//	  <run id>     → empty: finished runs intake has not acknowledged yet
//	history/       (schema version 2)
//	  <agent> NUL <connector> NUL <channel> NUL <thread>
//	               → JSON {updated_at, turns: [{role, text}]} (before
//	                 version 3 the bare turns array): the conversation's
//	                 earlier turns, appended when a run succeeds, bounded by
//	                 HistoryMaxTurns and HistoryMaxBytes, passed as
//	                 Request.History
//	quarantine/    (schema version 3)
//	  <bucket>/<key>[#n] → JSON {bucket, key, reason, at, value}: records
//	                 that could not be decoded, as found
//	agent_uids/    (created by the first allocation, in its own transaction)
//	  <agent id>   → uint32 big-endian: the agent's own uid and gid, from
//	                 [scheduler] agent_uids (internal/runprep owns it); kept
//	                 after the agent is removed, so no uid ever passes to
//	                 another agent
//	sandboxes/     (created by the first conversation sandbox, in its own
//	               transaction)
//	  <sandbox id> → JSON {id, agent, connector, channel, thread, backend,
//	                 handle, started_at, last_activity, runs}: a live
//	                 conversation sandbox, written before its agent reads
//	                 anything; a restarted scheduler kills each by its handle
//	                 and deletes it
//
// A run is in queue/ exactly while its state is queued, in deliveries/
// exactly while it is finished and not delivered, and in summaries/,
// by_state/ and by_agent/ exactly while it is in runs/ (putRun keeps them in
// step; the version 3 migration built them for older files).
package scheduler
