package hostrun

import (
	"fmt"
	"os"
	"os/exec"
	"time"
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
func (r Runner) rlimits(timeout time.Duration) []rlimit {
	lim := r.limits()
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

// limitWithRlimits makes cmd start its program through prlimit(1).
func (r Runner) limitWithRlimits(cmd *exec.Cmd, timeout time.Duration) error {
	if fi, err := os.Stat(prlimitPath); err != nil || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("cannot set rlimits: %s is missing (install util-linux)", prlimitPath)
	}
	args := []string{prlimitPath}
	for _, rl := range r.rlimits(timeout) {
		args = append(args, fmt.Sprintf("--%s=%d:%d", rl.option, rl.value, rl.value))
	}
	cmd.Args = append(append(args, "--"), cmd.Args...)
	cmd.Path = prlimitPath
	return nil
}

// Confinement is how host runs are confined on this machine: which limits
// hold and which do not. `berthctl sandbox explain` prints it.
type Confinement struct {
	// Mode is "transient unit" (systemd is PID 1 and the scheduler is root)
	// or "process" (rlimits on a child process).
	Mode    string
	Holds   []string
	Missing []string
}

// Explain reports how r confines a run with the given timeout and network
// setting on this machine.
func (r Runner) Explain(timeout time.Duration, allowNetwork bool) Confinement {
	lim := r.limits()
	if SystemdAvailable() {
		c := Confinement{Mode: "transient unit", Holds: []string{
			fmt.Sprintf("MemoryMax=%d (cgroup, whole run; swap off)", lim.MemoryMax),
			fmt.Sprintf("TasksMax=%d (cgroup, whole run)", lim.TasksMax),
			fmt.Sprintf("CPUQuota=%d%%", lim.CPUQuotaPercent),
			"PrivateTmp=yes", "NoNewPrivileges=yes", "ProtectSystem=strict (workspace and allow_read_write bound read-write)",
			"all processes of the run are killed when it ends (KillMode=control-group)",
		}}
		if timeout > 0 {
			c.Holds = append(c.Holds, fmt.Sprintf("RuntimeMaxSec=%s", timeout+runtimeGrace))
		}
		if allowNetwork {
			c.Missing = append(c.Missing, "PrivateNetwork (allow_network = true)")
		} else {
			c.Holds = append(c.Holds, "PrivateNetwork=yes")
		}
		return c
	}
	c := Confinement{Mode: "process", Missing: []string{
		"MemoryMax: RLIMIT_DATA limits each process, not the run as a whole",
		"TasksMax: RLIMIT_NPROC counts every process of the run_as user",
		"CPUQuota: no CPU share limit",
		"PrivateTmp, ProtectSystem: no mount namespace (Landlock still confines file access)",
	}}
	for _, rl := range r.rlimits(timeout) {
		c.Holds = append(c.Holds, fmt.Sprintf("%s=%d", rl.name, rl.value))
	}
	c.Holds = append(c.Holds, "NoNewPrivileges (set by berth-agent before Landlock)", "the process group is killed when the run ends")
	if allowNetwork {
		c.Missing = append(c.Missing, "network namespace (allow_network = true)")
	} else {
		c.Holds = append(c.Holds, "empty network namespace")
	}
	return c
}
