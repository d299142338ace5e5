// Package scheduler is berth-scheduler's logic: it accepts messages over
// D-Bus (dev.berth.Scheduler1.Submit), keeps them as runs in scheduler.db,
// runs each one through an isolation backend (one run per agent at a time,
// FIFO per agent, at most [scheduler] max_concurrent_runs in total) and hands
// the reply to intake (dev.berth.Intake1.Deliver) until intake acknowledges it.
//
// Every hand-off is persist-then-acknowledge: Submit returns once the run is
// committed; a run is delivered until the Deliverer returns nil; a scheduler
// that crashed finds its running runs on the next start, kills what the
// backend left behind and runs them again (once).
//
// cmd/berth-scheduler wires it: New, Export, Run until a signal, Close.
//
// # scheduler.db
//
// One bbolt file, opened by this process only:
//
//	meta/
//	  version      → uint64 big-endian: schema version (see migrations)
//	runs/
//	  <run id>     → JSON Run record; run ids sort by creation time
//	messages/
//	  <message id> → run id: the idempotency index of Submit
//	queue/         (NextSequence numbers it)
//	  <seq>        → run id, seq uint64 big-endian: queued runs in FIFO order;
//	                 a run keeps its seq, so a requeued run goes back to the
//	                 front of its agent's line
//	deliveries/
//	  <run id>     → empty: finished runs intake has not acknowledged yet
//	history/       (schema version 2)
//	  <connector> NUL <channel> NUL <thread>
//	               → JSON [{role, text}]: the conversation's earlier turns,
//	                 appended when a run succeeds, bounded by HistoryMaxTurns
//	                 and HistoryMaxBytes, passed as Request.History
//
// A run is in queue/ exactly while its state is queued, and in deliveries/
// exactly while it is finished and not delivered.
package scheduler
