package hostrun

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// Without systemd a host run's limits hold in one of three ways (ADR 13),
// decided per run by newRunLimits:
//
//   - a cgroup of its own where one is writable (cgroup*.go): memory with no
//     swap, pids and CPU for the run as a whole, an OOM kill tells, and every
//     process in it is killed at the end;
//   - per-process rlimits, only when the admin accepted them
//     ([scheduler] allow_rlimit_fallback = true, Limits.RlimitFallback): the
//     request carries them (agentproto.Request.Rlimits) and berth-agent
//     lowers its own, soft and hard (so they cannot be raised again), as the
//     first thing it does with the request, before anything of the run or a
//     tool; no capability is needed;
//   - else the run fails closed: a memory limit nothing can enforce for the
//     run as a whole is not run with.
//
// Explain says which one holds on this machine.

// rlimits are the limits an agent process sets on itself when no cgroup
// can hold its run and the admin accepted rlimits instead.
func rlimits(l isolation.Limits, timeout time.Duration) []rlimit {
	lim := limitsOf(l)
	rs := []rlimit{
		// Private writable memory (heap, stacks, anonymous mappings) of each
		// process; the closest rlimit to MemoryMax.
		{"RLIMIT_DATA", lim.MemoryMax},
		// Counts every process of the run_as user, not just this run's.
		{"RLIMIT_NPROC", lim.TasksMax},
		{"RLIMIT_CORE", 0},
	}
	if timeout > 0 {
		rs = append(rs, rlimit{"RLIMIT_CPU", cpuSeconds(timeout)})
	}
	return rs
}

type rlimit struct {
	name  string // RLIMIT_DATA
	value uint64
}

// request is the limits as the agent's request carries them.
func request(rs []rlimit) []agentproto.Rlimit {
	out := make([]agentproto.Rlimit, len(rs))
	for i, rl := range rs {
		out[i] = agentproto.Rlimit{Name: strings.ToLower(strings.TrimPrefix(rl.name, "RLIMIT_")), Value: rl.value}
	}
	return out
}

// runLimits enforces one host run's resource limits when it is not a
// transient unit. Run puts rlimits into the agent's request (the agent sets
// them on itself); startProcess calls prepare before Start, started after
// Start and before the agent gets its request (nothing of the run has
// forked yet), kill whenever the run's processes are being ended,
// oomKilled after the end, and release once, when the run is over.
// holdsAll says kill ends every process of the run (a cgroup lists them
// all), so the agent's session need not be looked for in /proc.
type runLimits interface {
	rlimits() []rlimit
	prepare() error
	started(pid int) error
	kill()
	holdsAll() bool
	oomKilled() bool
	release()
}

// newRunLimits chooses how a plan's limits hold for a plain host process:
// a cgroup, accepted rlimits, or a *RunError that fails the run closed.
func newRunLimits(spec isolation.Spec) (runLimits, error) {
	host, err := probeCgroupsOnce()
	if err == nil {
		return newCgroupLimits(host, isolation.AttemptName(spec.RunID, spec.Attempt), limitsOf(spec.Limits), spec.Timeout), nil
	}
	if spec.Limits.RlimitFallback {
		return rlimitLimits{l: spec.Limits, timeout: spec.Timeout}, nil
	}
	return nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: noCgroupDetail, Err: err}
}

// noCgroupDetail is why a run without systemd or a writable cgroup fails.
const noCgroupDetail = "the run's memory, processes and CPU cannot be limited as a whole: no systemd and no writable cgroup " +
	"(set [scheduler] allow_rlimit_fallback = true to accept per-process rlimits instead)"

// rlimitLimits are per-process rlimits, which berth-agent sets on itself.
type rlimitLimits struct {
	l       isolation.Limits
	timeout time.Duration
}

func (r rlimitLimits) rlimits() []rlimit { return rlimits(r.l, r.timeout) }
func (rlimitLimits) prepare() error      { return nil }
func (rlimitLimits) started(int) error   { return nil }
func (rlimitLimits) kill()               {}
func (rlimitLimits) holdsAll() bool      { return false }
func (rlimitLimits) oomKilled() bool     { return false }
func (rlimitLimits) release()            {}

// Explain reports how a plan's host run is confined on this machine: which
// limits hold and which do not, and why a plan that lacks one is refused.
func (r Runner) Explain(p isolation.Plan) isolation.Confinement {
	c := r.explain(p)
	if err := p.RequireLimits(); err != nil {
		c.Missing = append(c.Missing, "the run is refused: "+err.Error())
	}
	return c
}

func (r Runner) explain(p isolation.Plan) isolation.Confinement {
	lim := limitsOf(p.Limits)
	allowNetwork := p.Policy.Network
	if r.units() {
		c := isolation.Confinement{Mode: "transient unit", Holds: []string{
			fmt.Sprintf("MemoryMax=%d (cgroup, whole run; swap off)", lim.MemoryMax),
			fmt.Sprintf("TasksMax=%d (cgroup, whole run)", lim.TasksMax),
			fmt.Sprintf("CPUQuota=%d%%", lim.CPUQuotaPercent),
			"NoNewPrivileges=yes", "ProtectSystem=strict (workspace and allow_read_write bound read-write)",
			"all processes of the run are killed when it ends (KillMode=control-group)",
		}}
		if p.Timeout > 0 {
			c.Holds = append(c.Holds, fmt.Sprintf("RuntimeMaxSec=%s", p.Timeout+runtimeGrace))
		}
		if allowNetwork {
			c.Missing = append(c.Missing, "PrivateNetwork (allow_network = true)")
		} else {
			c.Holds = append(c.Holds, "PrivateNetwork=yes")
		}
		c.Holds = append(c.Holds, egressHolds(p)...)
		holds, missing := sandboxHolds(p, true)
		c.Holds, c.Missing = append(c.Holds, holds...), append(c.Missing, missing...)
		return c
	}
	c := isolation.Confinement{Mode: "process"}
	host, err := probeCgroups()
	switch {
	case err == nil:
		c.Holds, c.Missing = cgroupHolds(host, p)
	case p.Limits.RlimitFallback:
		c.Holds = append(c.Holds, "per-process rlimits instead of a cgroup, accepted by [scheduler] allow_rlimit_fallback = true (no writable cgroup: "+err.Error()+")")
		for _, rl := range rlimits(p.Limits, p.Timeout) {
			c.Holds = append(c.Holds, fmt.Sprintf("%s=%d", rl.name, rl.value))
		}
		c.Missing = append(c.Missing,
			"MemoryMax: RLIMIT_DATA limits each process, not the run as a whole",
			"TasksMax: RLIMIT_NPROC counts every process of the run's user",
			"CPUQuota: no CPU share limit",
			"processes that leave the agent's session are not killed when the run ends")
	default:
		c.Missing = append(c.Missing, "runs fail closed (confinement failed): no systemd and no writable cgroup to limit memory, processes and CPU of the run as a whole ("+err.Error()+"); [scheduler] allow_rlimit_fallback = true accepts per-process rlimits instead")
	}
	c.Holds = append(c.Holds, "NoNewPrivileges (set by berth-agent before Landlock)", "the agent's session is killed when the run ends")
	if allowNetwork {
		c.Missing = append(c.Missing, "network namespace (allow_network = true)")
	} else {
		c.Holds = append(c.Holds, "empty network namespace")
	}
	c.Holds = append(c.Holds, egressHolds(p)...)
	holds, missing := sandboxHolds(p, false)
	c.Holds, c.Missing = append(c.Holds, holds...), append(c.Missing, missing...)
	return c
}

// egressHolds says how a run with an egress plan gets out.
func egressHolds(p isolation.Plan) []string {
	if p.Egress == nil {
		return nil
	}
	return []string{"egress only through the run's socket " + p.Egress.SandboxSocket + " (loopback up, proxy on " + p.Egress.ProxyAddr + "); no provider key in the sandbox"}
}

// cgroupHolds are Explain's lines for a run in a cgroup of host: the files
// and values the run's cgroup gets, where, and what is kept as rlimits.
func cgroupHolds(host cgroupHost, p isolation.Plan) (holds, missing []string) {
	c := newCgroupLimits(host, isolation.AttemptName(p.RunID, p.Attempt), limitsOf(p.Limits), p.Timeout)
	name := c.name
	if p.RunID == "" {
		name = "<run id>-<attempt>." + strconv.Itoa(os.Getpid())
	}
	for _, parent := range host.parents {
		var vals []string
		for _, f := range c.files(parent) {
			vals = append(vals, f[0]+"="+f[1])
		}
		scope := "whole run"
		if parent.has("memory") && host.swap {
			scope += "; swap off"
		}
		holds = append(holds, fmt.Sprintf("cgroup v%d %s: %s (%s)", host.version, filepath.Join(parent.dir(), name), strings.Join(vals, " "), scope))
	}
	if !host.swap {
		missing = append(missing, "swap of the run is not limited: the kernel does not account swap to cgroups")
	}
	if host.noCPU != "" {
		missing = append(missing, "CPU quota: "+host.noCPU)
	}
	for _, rl := range beltAndBraces(p.Timeout) {
		holds = append(holds, fmt.Sprintf("%s=%d", rl.name, rl.value))
	}
	holds = append(holds,
		"an OOM kill in the run's cgroup ends the run with reason \""+isolation.ReasonOutOfMemory+"\"",
		"every process in the run's cgroup is killed when the run ends, and the cgroup is removed")
	return holds, missing
}
