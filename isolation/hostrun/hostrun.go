// Package hostrun runs berth-agent as a plain host process: as an unprivileged
// user, with a minimal environment, in its own process group, cut off from the
// network when the policy says so, with the request on stdin and the response
// on stdout. The landlock and unrestricted backends share it; what confines
// the agent's file access is berth-agent itself, following the request's
// Policy.
package hostrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/agentio"
)

const (
	// MaxResponse caps what is read from the agent's stdout.
	MaxResponse = agentio.MaxResponse
	// StderrTail is how much of the agent's stderr is kept in Result.Stderr.
	StderrTail = agentio.StderrTail
	// ioGrace bounds how long output is drained after the agent exited (a
	// stray grandchild holding the pipes open must not stall the run).
	ioGrace = 2 * time.Second
)

// TestLandlockABIEnv is the one variable passed on from the scheduler's own
// environment: a test seam in berth-agent that can only lower the Landlock
// ABI the agent believes it has, that is only make runs fail.
const TestLandlockABIEnv = "BERTH_TEST_LANDLOCK_ABI"

// Path is the PATH an agent gets.
const Path = "/usr/local/bin:/usr/bin:/bin"

// Runner runs one request as a host process.
type Runner struct {
	// AllowRoot permits running the agent as uid 0 (unrestricted backend only).
	AllowRoot bool
	// Limits are the run's resource limits; zero means DefaultLimits. Under
	// systemd they are cgroup limits of a transient unit (unit.go), else
	// rlimits (limits.go).
	Limits Limits
}

// Run starts spec.AgentBinary, hands it the request and waits for its
// response. Errors are *isolation.RunError; the Result that comes with an
// error still carries the exit code and stderr tail when there were any.
func (r Runner) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	req := spec.Request
	if req.RunID == "" {
		req.RunID = spec.RunID
	}
	if req.RunID != spec.RunID {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonStart, "request run id %q does not match run %q", req.RunID, spec.RunID)
	}
	if req.Workspace == "" {
		req.Workspace = spec.Workspace
	}
	r = r.forAgent(spec)
	if !filepath.IsAbs(spec.AgentBinary) {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonStart, "agent binary %q is not an absolute path", spec.AgentBinary)
	}
	if fi, err := os.Stat(spec.AgentBinary); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("agent binary %q is not an executable file", spec.AgentBinary), Err: err}
	}
	if fi, err := os.Stat(spec.Workspace); err != nil || !fi.IsDir() {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("workspace %q is not a directory", spec.Workspace), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}
	cred, err := r.credential(spec.RunAs)
	if err != nil {
		return isolation.Result{}, err
	}
	input, err := json.Marshal(req)
	if err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot encode request", Err: err}
	}
	if SystemdAvailable() {
		return r.runUnit(ctx, newUnitRun(spec, req, input, cred, !req.Policy.Network))
	}

	stdout := agentio.NewStdout()
	stderr := agentio.NewTail()
	cmd := &exec.Cmd{
		Path:      spec.AgentBinary,
		Args:      []string{spec.AgentBinary},
		Env:       Environment(spec.Workspace),
		Dir:       spec.Workspace,
		Stdin:     bytes.NewReader(input),
		Stdout:    stdout,
		Stderr:    stderr,
		WaitDelay: ioGrace,
		SysProcAttr: &syscall.SysProcAttr{
			// A session of its own: tools may start their own process groups
			// (the shell tool does, to time out a command), but they stay in
			// the agent's session, which killSession ends as a whole.
			Setsid:     true,
			Pdeathsig:  syscall.SIGKILL,
			Credential: cred,
		},
	}
	if !req.Policy.Network {
		cutNetwork(cmd.SysProcAttr)
	}
	if err := r.limitWithRlimits(cmd, spec.Timeout); err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot limit the agent", Err: err}
	}

	// Pdeathsig fires when the thread that started the child exits, not the
	// process. Keeping this goroutine on its thread until the child is gone
	// stops the runtime from handing the thread to a goroutine that might
	// lock it and exit.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		if !req.Policy.Network && isNamespaceError(err) {
			return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot cut network", Err: err}
		}
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start " + spec.AgentBinary, Err: err}
	}
	pid := cmd.Process.Pid
	started, stErr := startTime(pid)
	if spec.OnStart != nil && stErr == nil {
		spec.OnStart(Handle(pid, started))
	}

	exited := make(chan struct{})
	go func() {
		waitExited(pid)
		close(exited)
	}()
	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		timer := time.NewTimer(spec.Timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	var killed *isolation.RunError
	select {
	case <-exited:
	case <-timeout:
		killed = isolation.Errorf(isolation.ReasonTimeout, "killed after %s", spec.Timeout)
	case <-ctx.Done():
		killed = &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}
	// The agent is still unreaped here (a zombie at worst), so its pid cannot
	// have been reused: killing its session is safe. After a normal exit this
	// ends whatever tools it left running.
	killSession(pid, started)
	<-exited
	waitErr := cmd.Wait()

	res := isolation.Result{ExitCode: cmd.ProcessState.ExitCode(), Stderr: stderr.String()}
	if killed != nil {
		killed.Detail = agentio.WithTail(killed.Detail, res.Stderr)
		return res, killed
	}
	return interpret(res, stdout, req.RunID, waitErr)
}

// interpret maps the exit status and stdout of a finished agent to a Result
// or a RunError.
func interpret(res isolation.Result, stdout *agentio.Stdout, runID string, waitErr error) (isolation.Result, error) {
	if res.ExitCode < 0 {
		detail := "agent was killed"
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				detail = "agent was killed by signal " + ws.Signal().String()
			}
		}
		return res, isolation.Errorf(isolation.ReasonCrashed, "%s", agentio.WithTail(detail, res.Stderr))
	}
	return agentio.Interpret(res, stdout, runID)
}

// Environment is the complete environment of an agent: nothing of the
// scheduler's own environment except TestLandlockABIEnv.
func Environment(workspace string) []string {
	env := []string{
		"PATH=" + Path,
		"HOME=" + workspace,
		"LANG=C.UTF-8",
	}
	if v, ok := os.LookupEnv(TestLandlockABIEnv); ok {
		env = append(env, TestLandlockABIEnv+"="+v)
	}
	return env
}

// credential resolves runAs to the credential the child gets: nil means "as
// the scheduler itself".
func (r Runner) credential(runAs string) (*syscall.Credential, error) {
	self := os.Geteuid()
	if runAs == "" {
		if self == 0 && !r.AllowRoot {
			return nil, isolation.Errorf(isolation.ReasonStart, "no run_as user given and the scheduler runs as root; refusing to run the agent as root")
		}
		return nil, nil
	}
	u, err := lookupUser(runAs)
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot find run_as user %q", runAs), Err: err}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("user %q has no numeric ids", runAs), Err: err}
	}
	if uid == 0 && !r.AllowRoot {
		return nil, isolation.Errorf(isolation.ReasonStart, "run_as user %q is root; this backend runs agents only as an unprivileged user", runAs)
	}
	if self != 0 {
		if uint64(self) != uid {
			return nil, isolation.Errorf(isolation.ReasonStart, "the scheduler runs as uid %d and cannot switch to run_as user %q (uid %d); run the scheduler as root or leave run_as empty", self, runAs, uid)
		}
		return nil, nil
	}
	var groups []uint32
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				groups = append(groups, uint32(g))
			}
		}
	}
	if len(groups) == 0 {
		groups = []uint32{uint32(gid)}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}, nil
}

func lookupUser(name string) (*user.User, error) {
	u, err := user.Lookup(name)
	if err == nil {
		return u, nil
	}
	if _, perr := strconv.ParseUint(name, 10, 32); perr == nil {
		if u, ierr := user.LookupId(name); ierr == nil {
			return u, nil
		}
	}
	return nil, err
}

// cutNetwork puts the child in a new, empty network namespace (only a down
// loopback). Root can do that directly; anyone else needs a user namespace
// around it, mapping only itself. If the kernel refuses, Start fails and the
// run fails closed.
func cutNetwork(attr *syscall.SysProcAttr) {
	if os.Geteuid() == 0 {
		attr.Cloneflags |= syscall.CLONE_NEWNET
		return
	}
	uid, gid := os.Geteuid(), os.Getegid()
	attr.Cloneflags |= syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
	attr.GidMappingsEnableSetgroups = false
}

// isNamespaceError tells clone and id-map failures (what cutting the network
// runs into) from exec failures, which the checks before Start make unlikely.
func isNamespaceError(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EPERM, syscall.EINVAL, syscall.ENOSPC, syscall.EUSERS, syscall.ENOSYS:
		return true
	}
	return false
}

// waitExited blocks until pid has exited without reaping it, so the pid stays
// ours until cmd.Wait.
func waitExited(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// Handle is what OnStart reports and Kill understands: the pid plus its start
// time, so a reused pid is never killed.
func Handle(pid int, startTime uint64) string {
	return fmt.Sprintf("pid:%d:%d", pid, startTime)
}

// Kill ends the process group of the agent named by handle if that very
// process still runs. A process that is gone, or a pid now used by another
// process, is not an error.
func Kill(ctx context.Context, handle string) error {
	if strings.HasPrefix(handle, unitHandlePrefix) {
		return killUnit(ctx, handle)
	}
	pid, want, err := parseHandle(handle)
	if err != nil {
		return err
	}
	got, err := startTime(pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot check process %d: %w", pid, err)
	}
	if got != want {
		return nil
	}
	killSession(pid, want)
	return nil
}

// killSession SIGKILLs every process in session sid that started no earlier
// than the session leader (so a reused session id is left alone), repeating
// until none is left: a process may fork while we scan.
func killSession(sid int, leaderStart uint64) {
	for round := 0; round < 10; round++ {
		found := false
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			session, start, err := sessionAndStart(pid)
			if err != nil || session != sid || start < leaderStart {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func parseHandle(handle string) (int, uint64, error) {
	parts := strings.Split(handle, ":")
	if len(parts) != 3 || parts[0] != "pid" {
		return 0, 0, fmt.Errorf("cannot parse handle %q: want pid:<pid>:<starttime>", handle)
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 1 {
		return 0, 0, fmt.Errorf("cannot parse handle %q: bad pid", handle)
	}
	st, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cannot parse handle %q: bad start time", handle)
	}
	return pid, st, nil
}

// startTime reads field 22 of /proc/<pid>/stat (clock ticks since boot).
func startTime(pid int) (uint64, error) {
	_, st, err := sessionAndStart(pid)
	return st, err
}

// sessionAndStart reads fields 6 (session id) and 22 (start time) of
// /proc/<pid>/stat.
func sessionAndStart(pid int) (int, uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces and
	// parentheses itself; fields after the last ')' start at field 3.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	const sessionIdx, startIdx = 6 - 3, 22 - 3
	if len(fields) <= startIdx {
		return 0, 0, fmt.Errorf("cannot parse /proc/%d/stat: too few fields", pid)
	}
	session, err := strconv.Atoi(fields[sessionIdx])
	if err != nil {
		return 0, 0, fmt.Errorf("cannot parse session of %d: %w", pid, err)
	}
	start, err := strconv.ParseUint(fields[startIdx], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cannot parse start time of %d: %w", pid, err)
	}
	return session, start, nil
}

// forAgent applies the agent's memory_limit (container_mode.memory_limit,
// which config validation has parsed already) to this run, so a host run is
// held to the same memory as the agent's containers would be.
func (r Runner) forAgent(spec isolation.Spec) Runner {
	if spec.Container.MemoryLimit == "" {
		return r
	}
	n, err := config.ParseMemoryLimit(spec.Container.MemoryLimit)
	if err != nil || n <= 0 {
		return r
	}
	r.Limits = r.limits()
	r.Limits.MemoryMax = uint64(n)
	return r
}
