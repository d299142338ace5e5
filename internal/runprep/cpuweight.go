package runprep

import "github.com/berth-dev/berth/isolation/hostrun"

// SetRunsCPUWeight gives host runs the CPU weight of [scheduler]
// runs_cpu_weight (ADR 30). It is here, not in the scheduler, because the
// scheduler only schedules: what a run's sandbox gets is run preparation's.
func SetRunsCPUWeight(w int) error { return hostrun.SetRunsCPUWeight(w) }
