package hostrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// A kept host sandbox is one berth-agent in serve mode, started as a run's
// agent is (its user, session, namespaces — so its own /tmp and /var/tmp
// tmpfs for its whole life — and a cgroup of its own or accepted rlimits)
// and kept until it is stopped. The goroutine that started it keeps its
// locked thread for as long as the agent lives: Pdeathsig fires when that
// thread ends, and a thread that entered the sandbox's namespaces is never
// handed back. A scheduler that dies takes the agent with it (Pdeathsig);
// what its tools left in the cgroup is removed by Kill(handle), or by the
// next scheduler's leftover sweep. A kept host sandbox is never reattached:
// its stdin and stdout were the dead scheduler's pipes. Under systemd it is
// a transient unit instead (keep_unit.go).

// keptHandlePrefix marks handles of kept host sandboxes:
// kept:<pid>:<start time>:<cgroup name, "" without one>.
const keptHandlePrefix = "kept:"

// keepPoll is how often a stopping sandbox is looked at until it is empty.
const keepPoll = 5 * time.Millisecond

var _ isolation.Keeper = Runner{}

// Start opens a kept sandbox for spec (isolation.Keeper). Its limits hold
// for the sandbox as a whole; the plan's timeout bounds each request, not
// the sandbox, so no CPU-time rlimit is set.
func (r Runner) Start(ctx context.Context, spec isolation.Spec) (isolation.Kept, error) {
	if err := spec.RequireLimits(); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(spec.AgentBinary) {
		return nil, isolation.Errorf(isolation.ReasonStart, "agent binary %q is not an absolute path", spec.AgentBinary)
	}
	if fi, err := os.Stat(spec.Workspace); err != nil || !fi.IsDir() {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("workspace %q is not a directory", spec.Workspace), Err: err}
	}
	cred, err := r.credential(spec.Plan)
	if err != nil {
		return nil, err
	}
	spec.Policy = withScratch(spec.Policy)
	if r.units() {
		return startKeptUnit(ctx, spec, cred)
	}
	lifelong := spec
	lifelong.Timeout = 0
	lim, err := newRunLimits(lifelong)
	if err != nil {
		return nil, err
	}
	spec.Request.Rlimits = request(lim.rlimits())

	out := isolation.NewKeptOutput()
	type launched struct {
		body  *keptProcess
		stdin *os.File
		err   error
	}
	started := make(chan launched, 1)
	go func() {
		runtime.LockOSThread()
		inNamespace := false
		p, stdin, err := launchAgent(spec, []string{agentproto.ServeArg}, cred, lim, out.Stdout(), out.Stderr(), &inNamespace)
		if err != nil {
			if !inNamespace {
				runtime.UnlockOSThread()
			}
			started <- launched{err: err}
			return
		}
		body := &keptProcess{p: p, exited: make(chan struct{})}
		started <- launched{body: body, stdin: stdin}
		body.waitAgent()
		if !inNamespace {
			runtime.UnlockOSThread()
		}
	}()
	l := <-started
	if l.err != nil {
		return nil, l.err
	}
	return isolation.OpenKept(ctx, spec, l.body, l.stdin, out)
}

// keptProcess is a kept sandbox's agent process and its limits.
type keptProcess struct {
	p      *process
	exited chan struct{}
	exit   isolation.Exit
}

// waitAgent waits for the agent to exit and reaps it. Without a cgroup its
// session is killed first, while its pid is still ours: nothing else could
// find what it left.
func (k *keptProcess) waitAgent() {
	p := k.p
	waitExited(p.pid)
	p.mu.Lock()
	if !p.lim.holdsAll() {
		killSession(p.pid, p.started)
	}
	p.reaping = true
	p.mu.Unlock()
	// Its error says the same as ProcessState, or that the output was
	// still held open after WaitDelay by a tool that outlives the agent.
	_ = p.cmd.Wait()
	exit := isolation.Exit{Code: p.cmd.ProcessState.ExitCode()}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		exit.Code, exit.Signal = -1, ws.Signal()
	}
	k.exit = exit
	close(k.exited)
}

func (k *keptProcess) Handle() string {
	name := ""
	if c, ok := k.p.lim.(*cgroupLimits); ok && len(c.made) > 0 {
		name = c.name
	}
	return keptHandlePrefix + strconv.Itoa(k.p.pid) + ":" + strconv.FormatUint(k.p.started, 10) + ":" + name
}

func (k *keptProcess) Exited() <-chan struct{}    { return k.exited }
func (k *keptProcess) ExitStatus() isolation.Exit { return k.exit }

// Terminate sends SIGTERM to every process of the sandbox: its cgroup's
// members, or (rlimits) the agent's session.
func (k *keptProcess) Terminate(context.Context) error {
	if dir, rel := k.members(); dir != "" {
		pids, err := procsOf(dir)
		if err != nil {
			return fmt.Errorf("cannot list the sandbox's processes: %w", err)
		}
		for _, pid := range pids {
			signalMember(pid, rel, syscall.SIGTERM)
		}
		return nil
	}
	k.p.mu.Lock()
	defer k.p.mu.Unlock()
	if !k.p.reaping {
		signalSession(k.p.pid, k.p.started, syscall.SIGTERM)
	}
	return nil
}

// WaitEnded returns once the agent has exited and its cgroup holds no live
// process (without a cgroup the agent's exit ends its session).
func (k *keptProcess) WaitEnded(ctx context.Context) error {
	select {
	case <-k.exited:
	case <-ctx.Done():
		return ctx.Err()
	}
	dir, _ := k.members()
	if dir == "" {
		return nil
	}
	for {
		pids, err := procsOf(dir)
		if err != nil || !hasRunning(pids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(keepPoll):
		}
	}
}

// members is the cgroup directory that lists every process of the sandbox
// and, when it is the pids one, its name as /proc/<pid>/cgroup says it;
// "" without a cgroup. A v1 host may have only a memory hierarchy writable.
func (k *keptProcess) members() (dir, rel string) {
	c, ok := k.p.lim.(*cgroupLimits)
	switch {
	case !ok:
		return "", ""
	case c.procs != "":
		return c.procs, c.procsRel
	case len(c.made) > 0:
		return c.made[0], ""
	}
	return "", ""
}

func hasRunning(pids []int) bool {
	for _, pid := range pids {
		if running(pid) {
			return true
		}
	}
	return false
}

// Kill ends every process of the sandbox now.
func (k *keptProcess) Kill(context.Context) error {
	k.p.mu.Lock()
	defer k.p.mu.Unlock()
	if !k.p.reaping && !k.p.lim.holdsAll() {
		killSession(k.p.pid, k.p.started)
	}
	k.p.lim.kill()
	return nil
}

func (k *keptProcess) OOMKilled(context.Context) bool { return k.p.lim.oomKilled() }

// Memory is the sandbox cgroup's memory use (every process of it and the
// page cache it caused, its /tmp included).
func (k *keptProcess) Memory(context.Context) (int64, error) {
	c, ok := k.p.lim.(*cgroupLimits)
	if !ok || c.mem == "" {
		return 0, errors.New("cannot measure the sandbox's memory: it has no cgroup of its own (rlimits)")
	}
	file := "memory.usage_in_bytes"
	if c.host.version == 2 {
		file = "memory.current"
	}
	data, err := os.ReadFile(filepath.Join(c.mem, file))
	if err != nil {
		return 0, fmt.Errorf("cannot read the sandbox's memory: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cannot read the sandbox's memory: %w", err)
	}
	return n, nil
}

// Release kills what is left and removes the sandbox's cgroup.
func (k *keptProcess) Release() { k.p.lim.release() }

// signalMember sends sig to pid if it is (still) in the cgroup rel.
func signalMember(pid int, rel string, sig syscall.Signal) {
	if rel != "" && !inCgroup(pid, rel) {
		return
	}
	_ = syscall.Kill(pid, sig)
}

// signalSession sends sig once to every live process of session sid that
// started no earlier than its leader.
func signalSession(sid int, leaderStart uint64, sig syscall.Signal) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.session != sid || st.start < leaderStart || st.state == 'Z' {
			continue
		}
		_ = syscall.Kill(pid, sig)
	}
}

// killKept ends a kept host sandbox named by its handle after its owner is
// gone: the agent's session if that very process still runs, then its
// cgroup, with everything in it, in every hierarchy.
func killKept(handle string) error {
	parts := strings.SplitN(strings.TrimPrefix(handle, keptHandlePrefix), ":", 3)
	if len(parts) != 3 {
		return fmt.Errorf("cannot parse handle %q: want %s<pid>:<starttime>:<cgroup>", handle, keptHandlePrefix)
	}
	pid, want, err := parseHandle("pid:" + parts[0] + ":" + parts[1])
	if err != nil {
		return err
	}
	name := parts[2]
	if strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("cannot parse handle %q: bad cgroup name", handle)
	}
	if got, err := startTime(pid); err == nil && got == want {
		killSession(pid, want)
	}
	if name == "" {
		return nil
	}
	host, err := probeCgroupsOnce()
	if err != nil {
		return fmt.Errorf("cannot find the sandbox's cgroup %s: %w", name, err)
	}
	var errs []error
	for _, p := range host.parents {
		if err := removeCgroup(host.version, filepath.Join(p.dir(), name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
