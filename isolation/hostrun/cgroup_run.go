package hostrun

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupLimits are one run's cgroups (one per v1 hierarchy, one on v2).
type cgroupLimits struct {
	host    cgroupHost
	runID   string
	name    string
	lim     Limits
	timeout time.Duration

	made []string // run cgroup directories made, parents' order
	// procs is the run cgroup whose cgroup.procs lists the run's processes
	// (v1: the pids hierarchy's); procsRel is it as /proc/<pid>/cgroup
	// names it, and mem the one with the memory controller.
	procs, procsRel, mem string

	releaseOnce sync.Once
}

func newCgroupLimits(host cgroupHost, runID string, lim Limits, timeout time.Duration) *cgroupLimits {
	return &cgroupLimits{host: host, runID: runID, name: cgroupName(runID, os.Getpid()), lim: lim, timeout: timeout}
}

// cleaned holds the berth-runs directories this process has cleaned of
// what schedulers that are gone left behind.
var cleaned sync.Map

// files are the interface files of p's run cgroup and their values.
func (c *cgroupLimits) files(p cgroupParent) [][2]string {
	if c.host.version == 2 {
		return v2Files(c.host, c.lim)
	}
	return v1Files(c.host, p, c.lim)
}

// rlimits are kept as belt and braces: no core dumps, and a CPU time limit
// from the timeout.
func (c *cgroupLimits) rlimits() []rlimit { return beltAndBraces(c.timeout) }

// prepare makes the run's cgroups with their limits (nothing is in them
// yet).
func (c *cgroupLimits) prepare() error {
	for _, p := range c.host.parents {
		if c.host.version == 2 {
			if err := v2Prepare(c.host, p); err != nil {
				return err
			}
		} else if err := os.Mkdir(p.dir(), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cannot make %s: %w", p.dir(), err)
		}
		if _, done := cleaned.LoadOrStore(p.dir(), true); !done {
			removeLeftovers(c.host.version, p.dir())
		}
		weighRuns(c.host, p)
	}
	for i, p := range c.host.parents {
		dir := filepath.Join(p.dir(), c.name)
		err := os.Mkdir(dir, 0o755)
		// The first hierarchy picks the name: a run id this process runs
		// twice at once (tests do) gets a suffix.
		for n := 2; i == 0 && errors.Is(err, os.ErrExist) && n <= 100; n++ {
			c.name = cgroupName(c.runID+"-"+strconv.Itoa(n), os.Getpid())
			dir = filepath.Join(p.dir(), c.name)
			err = os.Mkdir(dir, 0o755)
		}
		if err != nil {
			return fmt.Errorf("cannot make the run's cgroup: %w", err)
		}
		c.made = append(c.made, dir)
		for _, f := range c.files(p) {
			if err := writeCgroup(dir, f[0], f[1]); err != nil {
				return err
			}
		}
		if p.has("pids") && c.procs == "" {
			c.procs, c.procsRel = dir, path.Join(p.rel, runsCgroup, c.name)
		}
		if p.has("memory") && c.mem == "" {
			c.mem = dir
		}
	}
	return nil
}

// started moves the agent into the run's cgroups before it has its request,
// and so before it forks anything.
func (c *cgroupLimits) started(pid int) error {
	for _, dir := range c.made {
		if err := writeCgroup(dir, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// holdsAll: a process of the run cannot leave its cgroup (the agent's uid
// may not write to another cgroup.procs), so killing the cgroup's members
// ends the run, also what left the agent's session with setsid.
func (c *cgroupLimits) holdsAll() bool { return c.procs != "" }

// kill ends every process in the run's cgroup.
func (c *cgroupLimits) kill() {
	if c.procs != "" {
		killCgroup(c.host.version, c.procs, c.procsRel)
	}
}

// oomKilled reads the kernel's count of OOM kills in the run's cgroup.
func (c *cgroupLimits) oomKilled() bool {
	if c.mem == "" {
		return false
	}
	file, key := filepath.Join(c.mem, "memory.oom_control"), "oom_kill"
	if c.host.version == 2 {
		file = filepath.Join(c.mem, "memory.events")
	}
	n, _ := readKey(file, key)
	return n > 0
}

// release kills what is left and removes the run's cgroups.
func (c *cgroupLimits) release() {
	c.releaseOnce.Do(func() {
		c.kill()
		for _, dir := range c.made {
			if err := removeCgroup(c.host.version, dir); err != nil {
				slog.Warn("cannot remove the run's cgroup", "run_id", c.runID, "path", dir, "err", err)
			}
		}
	})
}

// removeCgroup removes a run cgroup, killing what is in it first: a killed
// process leaves its cgroup a moment after the signal.
func removeCgroup(version int, dir string) error {
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cannot remove %s: %w", dir, err)
		}
		killCgroup(version, dir, "")
		time.Sleep(10 * time.Millisecond)
	}
}

// removeLeftovers removes the run cgroups in parent made by schedulers that
// are gone (a crash skips release), killing what still runs in them. Run
// cgroups of live schedulers, this one included, are left alone.
func removeLeftovers(version int, parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, e := range entries {
		owner := ownerOf(e.Name())
		if !e.IsDir() || owner == 0 || owner == self || alive(owner) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if err := removeCgroup(version, dir); err != nil {
			slog.Warn("cannot remove a run cgroup left behind", "path", dir, "err", err)
			continue
		}
		slog.Info("removed a run cgroup a scheduler left behind", "path", dir)
	}
}

// killCgroup SIGKILLs every process in the cgroup dir until none is left.
// v2 has cgroup.kill; on v1 pids.max goes to 0 first so nothing can fork,
// and each pid is checked to still be in the cgroup (rel, as
// /proc/<pid>/cgroup names it; "" skips the check) through a pidfd, so a
// reused pid is never hit.
func killCgroup(version int, dir, rel string) {
	if version == 2 && writeCgroup(dir, "cgroup.kill", "1") == nil {
		waitEmpty(dir)
		return
	}
	_ = writeCgroup(dir, "pids.max", "0")
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		pids, err := procsOf(dir)
		if err != nil {
			return
		}
		live := 0
		for _, pid := range pids {
			if running(pid) {
				live++
				killMember(pid, rel)
			}
		}
		if live == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitEmpty waits (bounded) until no live process is left in dir.
func waitEmpty(dir string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		pids, err := procsOf(dir)
		if err != nil || !slices.ContainsFunc(pids, running) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running reports whether pid is a process that has not exited (a zombie
// has: it only waits to be reaped).
func running(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

// killMember SIGKILLs pid if it is (still) in the cgroup rel.
func killMember(pid int, rel string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		return
	}
	defer unix.Close(fd)
	if rel != "" && !inCgroup(pid, rel) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// inCgroup reports whether /proc/<pid>/cgroup names rel (or a cgroup below it).
func inCgroup(pid int, rel string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, p := range parseCgroupFile(data) {
		if within(p, rel) {
			return true
		}
	}
	return false
}

// beltAndBraces are the rlimits a run in a cgroup still gets.
func beltAndBraces(timeout time.Duration) []rlimit {
	rs := []rlimit{{"RLIMIT_CORE", 0}}
	if timeout > 0 {
		rs = append(rs, rlimit{"RLIMIT_CPU", cpuSeconds(timeout)})
	}
	return rs
}

// cpuSeconds is the CPU-time rlimit of a run's timeout, rounded up.
func cpuSeconds(timeout time.Duration) uint64 {
	return uint64((timeout + time.Second - 1) / time.Second)
}
