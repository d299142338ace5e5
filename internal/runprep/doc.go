// Package runprep readies a run before its backend starts it, and cleans up
// after it: the one step between the scheduler's claim of a run and
// Backend.Run (docs/adr/0018-run-preparation.md).
//
// Prepare compiles the run's plan (internal/runplan chooses the backend,
// once), and then makes what the plan needs on this host: the agent's own
// uid (allocated on first use), its workspace handed to that user with its
// quota enforced, the isolation image berth-imaged builds for it, and the
// run's egress proxy holding the keys the sandbox never sees. Prepared.Finish
// stops the proxy and returns what it decided. Sweep removes what a crashed
// scheduler left behind (sandboxes, egress directories); Warm fills the
// container backend's warm pools with plans as a run would get them.
//
// Everything the step touches is a seam of Options: the backends, the image
// service, the uid store (a bucket of scheduler.db, which this package owns):
//
//	agent_uids/    (created by the first allocation, in its own transaction)
//	  <agent id>   → uint32 big-endian: the agent's own uid and gid, from
//	                 [scheduler] agent_uids; kept after the agent is removed,
//	                 so no uid ever passes to another agent
//
// The scheduler schedules (claim, Prepare, Backend.Run, Finish, record,
// deliver); this package never reads or writes a run record.
package runprep
