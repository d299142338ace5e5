package scheduler

import (
	"context"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// egressProxyLimits bound each run's berth-egress: a run that exhausts its
// proxy (bodies, connections, threads) starves only its own.
var egressProxyLimits = hostrun.Limits{MemoryMax: 128 << 20, TasksMax: 128, CPUQuotaPercent: 100}

// confineEgress puts a run's proxy into a scope or cgroup of its own. Where
// neither can be made the run fails, unless [scheduler]
// allow_rlimit_fallback accepts a proxy without limits, as it accepts host
// runs without cgroups.
func (s *Service) confineEgress(ctx context.Context, plan isolation.Plan) func(pid int) (func(), error) {
	return func(pid int) (func(), error) {
		h, err := hostrun.ConfineHelper(ctx, "egress", isolation.AttemptName(plan.RunID, plan.Attempt), pid, egressProxyLimits, hostrun.SystemdAvailable())
		if err != nil {
			if plan.Limits.RlimitFallback {
				s.log.Warn("the run's egress proxy runs without limits of its own (allow_rlimit_fallback)", "run_id", plan.RunID, "err", err)
				return func() {}, nil
			}
			return nil, err
		}
		return h.Release, nil
	}
}
