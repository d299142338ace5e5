package scheduler

import (
	"time"

	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/schedules"
)

// markScheduled makes r job's run: the record keeps the job's model and
// max_runtime, so the run (and a retry after a restart) is compiled with
// them, and the record says which model and limit it ran with.
func markScheduled(r *Run, job schedules.Job) {
	r.Schedule = job.ID
	r.Model = job.Model
	// max_runtime is checked to whole seconds from 1s; round up, not to 0.
	r.MaxRuntimeSeconds = int64((job.MaxRuntime + time.Second - 1) / time.Second)
}

// overrides are what r's plan changes of its agent's: none for a message's
// run.
func (r Run) overrides() runplan.Overrides {
	if !r.overridden() {
		return runplan.Overrides{}
	}
	return runplan.Overrides{
		Model:   r.Model,
		Timeout: time.Duration(r.MaxRuntimeSeconds) * time.Second,
		From:    "schedule " + r.Schedule,
	}
}

// overridden says whether r runs with a model or limit not its agent's.
func (r Run) overridden() bool { return r.Model != "" || r.MaxRuntimeSeconds != 0 }
