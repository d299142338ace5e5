package hostrun

import (
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// Without systemd the runner cannot give a run a cgroup of its own; it sets
// rlimits instead. The agent starts through prlimit(1), which lowers its own
// limits (soft and hard, so they cannot be raised again) after the switch to
// the run_as user and then executes berth-agent: the limits hold before the
// agent runs, and no capability is needed to set them. They are weaker than
// cgroup limits, and Explain says so.

// prlimitPath is util-linux's prlimit (essential on Debian and Fedora).
var prlimitPath = "/usr/bin/prlimit"

// rlimits are the limits set on an agent process without systemd.
func rlimits(l isolation.Limits, timeout time.Duration) []rlimit {
	lim := limitsOf(l)
	rs := []rlimit{
		// Private writable memory (heap, stacks, anonymous mappings) of each
		// process; the closest rlimit to MemoryMax.
		{"data", "RLIMIT_DATA", lim.MemoryMax},
		// Counts every process of the run_as user, not just this run's.
		{"nproc", "RLIMIT_NPROC", lim.TasksMax},
		{"core", "RLIMIT_CORE", 0},
	}
	if timeout > 0 {
		rs = append(rs, rlimit{"cpu", "RLIMIT_CPU", uint64((timeout + time.Second - 1) / time.Second)})
	}
	return rs
}

type rlimit struct {
	option string // prlimit's long option
	name   string
	value  uint64
}

// runLimits enforces one host run's resource limits when it is not a
// transient unit. startProcess calls prepare before Start, started after
// Start and before the agent gets its request (nothing of the run has
// forked yet), kill whenever the run's processes are being ended,
// oomKilled after the end, and release once, when the run is over.
type runLimits interface {
	prepare(cmd *exec.Cmd) error
	started(pid int) error
	kill()
	oomKilled() bool
	release()
}

// newRunLimits chooses how a plan's limits hold for a plain host process.
func newRunLimits(spec isolation.Spec) (runLimits, error) {
	return rlimitLimits{l: spec.Limits, timeout: spec.Timeout}, nil
}

// rlimitLimits are per-process rlimits set through prlimit(1).
type rlimitLimits struct {
	l       isolation.Limits
	timeout time.Duration
}

func (r rlimitLimits) prepare(cmd *exec.Cmd) error { return limitWithRlimits(cmd, r.l, r.timeout) }
func (rlimitLimits) started(int) error             { return nil }
func (rlimitLimits) kill()                         {}
func (rlimitLimits) oomKilled() bool               { return false }
func (rlimitLimits) release()                      {}

// limitWithRlimits makes cmd start its program through prlimit(1).
func limitWithRlimits(cmd *exec.Cmd, l isolation.Limits, timeout time.Duration) error {
	if fi, err := os.Stat(prlimitPath); err != nil || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("cannot set rlimits: %s is missing (install util-linux)", prlimitPath)
	}
	args := []string{prlimitPath}
	for _, rl := range rlimits(l, timeout) {
		args = append(args, fmt.Sprintf("--%s=%d:%d", rl.option, rl.value, rl.value))
	}
	cmd.Args = append(append(args, "--"), cmd.Args...)
	cmd.Path = prlimitPath
	return nil
}

// Explain reports how a plan's host run is confined on this machine: which
// limits hold and which do not.
func (r Runner) Explain(p isolation.Plan) isolation.Confinement {
	lim := limitsOf(p.Limits)
	allowNetwork := p.Policy.Network
	if r.units() {
		c := isolation.Confinement{Mode: "transient unit", Holds: []string{
			fmt.Sprintf("MemoryMax=%d (cgroup, whole run; swap off)", lim.MemoryMax),
			fmt.Sprintf("TasksMax=%d (cgroup, whole run)", lim.TasksMax),
			fmt.Sprintf("CPUQuota=%d%%", lim.CPUQuotaPercent),
			"PrivateTmp=yes", "NoNewPrivileges=yes", "ProtectSystem=strict (workspace and allow_read_write bound read-write)",
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
	c := isolation.Confinement{Mode: "process", Missing: []string{
		"MemoryMax: RLIMIT_DATA limits each process, not the run as a whole",
		"TasksMax: RLIMIT_NPROC counts every process of the run_as user",
		"CPUQuota: no CPU share limit",
		"PrivateTmp, ProtectSystem: no mount namespace (Landlock still confines file access)",
	}}
	for _, rl := range rlimits(p.Limits, p.Timeout) {
		c.Holds = append(c.Holds, fmt.Sprintf("%s=%d", rl.name, rl.value))
	}
	c.Holds = append(c.Holds, "NoNewPrivileges (set by berth-agent before Landlock)", "the process group is killed when the run ends")
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
