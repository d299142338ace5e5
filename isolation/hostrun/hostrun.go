// Package hostrun runs berth-agent as a plain host process: as an unprivileged
// user, with a minimal environment, in its own process group, cut off from the
// network when the policy says so, in mount and IPC namespaces of its own that
// hide the host's sockets (namespace.go), with the request on stdin and the
// response on stdout. The landlock and unrestricted backends share it; what confines
// the agent's file access is berth-agent itself, following the request's
// Policy.
package hostrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/hostsandbox"
	"github.com/berth-dev/berth/isolation"
)

const (
	// MaxResponse caps what is read from the agent's stdout.
	MaxResponse = isolation.MaxResponse
	// StderrTail is how much of the agent's stderr is kept in Result.Stderr.
	StderrTail = isolation.StderrTail
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
	// Systemd says whether runs become transient units; nil means
	// SystemdAvailable.
	Systemd func() bool
}

func (r Runner) units() bool {
	if r.Systemd != nil {
		return r.Systemd()
	}
	return SystemdAvailable()
}

// Run starts spec.AgentBinary under isolation.Supervise, hands it the
// request and waits for its response. The limits are the plan's: under
// systemd cgroup limits of a transient unit (unit.go), else a cgroup of the
// run's own or, where the admin accepted them, rlimits (limits.go). Errors are *isolation.RunError; the Result that comes with an
// error still carries the exit code and stderr tail when there were any.
func (r Runner) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	if err := spec.RequireLimits(); err != nil {
		return isolation.Result{}, err
	}
	if !filepath.IsAbs(spec.AgentBinary) {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonStart, "agent binary %q is not an absolute path", spec.AgentBinary)
	}
	if fi, err := os.Stat(spec.AgentBinary); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("agent binary %q is not an executable file", spec.AgentBinary), Err: err}
	}
	if fi, err := os.Stat(spec.Workspace); err != nil || !fi.IsDir() {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("workspace %q is not a directory", spec.Workspace), Err: err}
	}
	cred, err := r.credential(spec.Plan)
	if err != nil {
		return isolation.Result{}, err
	}
	spec.Policy = withScratch(spec.Policy)
	if r.units() {
		return isolation.Supervise(ctx, spec, func(ctx context.Context, spec isolation.Spec, input []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
			return startUnit(ctx, newUnitRun(spec, input, cred), stdout, stderr)
		})
	}
	// Pdeathsig fires when the thread that started the child exits, not the
	// process. Supervise starts the child on a goroutine locked to its
	// thread until the child is gone, so the runtime never hands the thread
	// to a goroutine that might lock it and exit. A thread that entered the
	// run's network namespace is never handed back: its goroutine exits
	// locked and the thread ends with the run.
	lim, err := newRunLimits(spec)
	if err != nil {
		return isolation.Result{}, err
	}
	// The agent sets its rlimits on itself, first thing with the request.
	spec.Request.Rlimits = request(lim.rlimits())
	type ran struct {
		res isolation.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		runtime.LockOSThread()
		inNamespace := false
		res, err := isolation.Supervise(ctx, spec, func(ctx context.Context, spec isolation.Spec, input []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
			return startProcess(spec, input, cred, lim, stdout, stderr, &inNamespace)
		})
		if !inNamespace {
			// A thread still in the host's namespace is handed back.
			runtime.UnlockOSThread()
		}
		done <- ran{res, err}
	}()
	r2 := <-done
	return r2.res, r2.err
}

// startProcess starts the agent as a child process in a session of its own.
func startProcess(spec isolation.Spec, input []byte, cred *syscall.Credential, lim runLimits, stdout, stderr io.Writer, inNamespace *bool) (isolation.Sandbox, error) {
	p, stdinW, err := launchAgent(spec, nil, cred, lim, stdout, stderr, inNamespace)
	if err != nil {
		return nil, err
	}
	go func() {
		// An agent that ends before reading all of it makes this fail
		// (EPIPE); its exit says why.
		_, _ = stdinW.Write(input)
		stdinW.Close()
	}()
	return p, nil
}

// launchAgent starts the agent with args in its limits and namespaces and
// returns it with the write end of its stdin, on which nothing was written.
func launchAgent(spec isolation.Spec, args []string, cred *syscall.Credential, lim runLimits, stdout, stderr io.Writer, inNamespace *bool) (*process, *os.File, error) {
	grace := spec.KillGrace
	if grace <= 0 {
		grace = isolation.DefaultKillGrace
	}
	// The request goes through a pipe written only once the agent is in
	// its limits (started): nothing it could fork runs outside them.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot make the agent's stdin", Err: err}
	}
	defer stdinR.Close()
	cmd := &exec.Cmd{
		Path:   spec.AgentBinary,
		Args:   append([]string{spec.AgentBinary}, args...),
		Env:    Environment(spec.Workspace),
		Dir:    spec.Workspace,
		Stdin:  stdinR,
		Stdout: stdout,
		Stderr: stderr,
		// Bounds the drain after the agent exited: a stray grandchild
		// holding the pipes open must not stall the run.
		WaitDelay: grace,
		SysProcAttr: &syscall.SysProcAttr{
			// A session of its own: tools may start their own process groups
			// (the shell tool does, to time out a command), but they stay in
			// the agent's session, which killSession ends as a whole.
			Setsid:     true,
			Pdeathsig:  syscall.SIGKILL,
			Credential: cred,
		},
	}
	root := os.Geteuid() == 0
	if isolatesHost(spec) && root {
		*inNamespace = true
		if err := enterMaskedNamespaces(spec.Plan); err != nil {
			stdinW.Close()
			return nil, nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot hide the host's sockets from the run", Err: err}
		}
	}
	if !spec.Policy.Network {
		if spec.Egress != nil && root {
			// The in-sandbox proxy listens on 127.0.0.1: the namespace needs
			// its loopback up, which the unprivileged agent cannot do.
			*inNamespace = true
			if err := enterNamespaceWithLoopback(); err != nil {
				stdinW.Close()
				return nil, nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot cut network", Err: err}
			}
		} else {
			cutNetwork(cmd.SysProcAttr, spec.Egress != nil)
		}
	}
	if isolatesHost(spec) && !root {
		// berth-agent masks the socket directories itself, in its own
		// user namespace, and then drops CAP_SYS_ADMIN with the rest.
		userNamespace(cmd.SysProcAttr, syscall.CLONE_NEWNS|syscall.CLONE_NEWIPC, []uintptr{unix.CAP_SYS_ADMIN})
		cmd.Env = append(cmd.Env, hostsandbox.MaskEnv+"=1")
	}
	if err := lim.prepare(); err != nil {
		stdinW.Close()
		lim.release()
		// Where the cgroups were found may have changed: look again.
		forgetCgroups()
		return nil, nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot limit the agent", Err: err}
	}
	if err := cmd.Start(); err != nil {
		stdinW.Close()
		lim.release()
		if cmd.SysProcAttr.Cloneflags != 0 && isNamespaceError(err) {
			return nil, nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot make the run's namespaces (network, mount, IPC)", Err: err}
		}
		return nil, nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start " + spec.AgentBinary, Err: err}
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, lim: lim, drained: make(chan struct{})}
	// A start time that cannot be read makes a handle Kill never matches:
	// safer than one that could match a reused pid.
	p.started, _ = startTime(p.pid)
	if err := lim.started(p.pid); err != nil {
		// The agent has read nothing yet: end it before it can.
		stdinW.Close()
		killSession(p.pid, p.started)
		_ = cmd.Wait()
		lim.release()
		return nil, nil, &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot limit the agent", Err: err}
	}
	return p, stdinW, nil
}

// process is a running agent child process.
type process struct {
	cmd     *exec.Cmd
	pid     int
	started uint64
	lim     runLimits
	drained chan struct{}

	mu      sync.Mutex
	reaping bool // the pid may be reaped: killing by pid is no longer safe
}

func (p *process) Handle() string { return Handle(p.pid, p.started) }

// Wait waits for the agent to exit, ends what it left running in its
// session while its pid is still ours, and reaps it.
func (p *process) Wait(context.Context) (isolation.Exit, error) {
	waitExited(p.pid)
	p.mu.Lock()
	// The agent is unreaped here (a zombie at worst), so its pid cannot have
	// been reused: killing its session is safe. A run in a cgroup of its own
	// is ended through the cgroup, which holds every process of it; the
	// session scan reads all of /proc, a quarter of the scheduler's CPU per
	// run when it was done for every run.
	if !p.lim.holdsAll() {
		killSession(p.pid, p.started)
	}
	p.lim.kill()
	p.reaping = true
	p.mu.Unlock()
	waitErr := p.cmd.Wait()
	close(p.drained)
	exit := isolation.Exit{Code: p.cmd.ProcessState.ExitCode()}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			exit.Code, exit.Signal = -1, ws.Signal()
		}
	}
	return exit, nil
}

func (p *process) Kill(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaping && !p.lim.holdsAll() {
		killSession(p.pid, p.started)
	}
	p.lim.kill()
	return nil
}

func (p *process) Drained() <-chan struct{} { return p.drained }

// Inspect asks the run's limits whether the kernel OOM-killed a process of
// the run (an rlimit makes allocations fail instead: never).
func (p *process) Inspect(context.Context, bool) bool { return p.lim.oomKilled() }

// Release frees the run's limits (its cgroup); exec closes the pipes (after
// WaitDelay).
func (p *process) Release() { p.lim.release() }

// Environment is the complete environment of an agent: nothing of the
// scheduler's own environment except TestLandlockABIEnv. TMPDIR is /tmp, a
// confined run's own (as a container's is).
func Environment(workspace string) []string {
	env := []string{
		"PATH=" + Path,
		"HOME=" + workspace,
		"TMPDIR=/tmp",
		"LANG=C.UTF-8",
	}
	if v, ok := os.LookupEnv(TestLandlockABIEnv); ok {
		env = append(env, TestLandlockABIEnv+"="+v)
	}
	return env
}

// credential is the credential the child gets: nil means "as the scheduler
// itself". The plan's looked-up user is used when there is one.
func (r Runner) credential(p isolation.Plan) (*syscall.Credential, error) {
	self := os.Geteuid()
	if p.RunAs == "" && p.User == nil {
		if self == 0 && !r.AllowRoot {
			return nil, isolation.Errorf(isolation.ReasonStart, "no run_as user given and the scheduler runs as root; refusing to run the agent as root")
		}
		return nil, nil
	}
	u := p.User
	if u == nil {
		var err error
		if u, err = isolation.LookupRunUser(p.RunAs); err != nil {
			return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot find run_as user %q", p.RunAs), Err: err}
		}
	}
	if u.UID == 0 && !r.AllowRoot {
		return nil, isolation.Errorf(isolation.ReasonStart, "run_as user %q is root; this backend runs agents only as an unprivileged user", u.Name)
	}
	if self != 0 {
		if uint32(self) != u.UID {
			return nil, isolation.Errorf(isolation.ReasonStart, "the scheduler runs as uid %d and cannot switch to run_as user %q (uid %d); run the scheduler as root or leave run_as empty", self, u.Name, u.UID)
		}
		return nil, nil
	}
	groups := append([]uint32(nil), u.Groups...)
	if len(groups) == 0 {
		groups = []uint32{u.GID}
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: groups}, nil
}

// cutNetwork puts the child in a new, empty network namespace (only a down
// loopback). Root can do that directly; anyone else needs a user namespace
// around it, mapping only itself. If the kernel refuses, Start fails and the
// run fails closed.
func cutNetwork(attr *syscall.SysProcAttr, egress bool) {
	if os.Geteuid() == 0 {
		attr.Cloneflags |= syscall.CLONE_NEWNET
		return
	}
	var caps []uintptr
	if egress {
		// berth-agent brings lo up for its egress proxy (it needs
		// CAP_NET_ADMIN in its own namespace for that), then drops every
		// capability before it reads anything or starts a tool.
		caps = []uintptr{unix.CAP_NET_ADMIN}
	}
	userNamespace(attr, syscall.CLONE_NEWNET, caps)
}

// enterNamespaceWithLoopback moves the calling thread (locked, and ended
// with the run) into a new, empty network namespace and brings its loopback
// up; a child started from the thread is born in it.
func enterNamespaceWithLoopback() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("cannot make a network namespace: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cannot bring up loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("cannot bring up loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("cannot bring up loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("cannot bring up loopback: %w", err)
	}
	return nil
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
	if strings.HasPrefix(handle, keptHandlePrefix) {
		return killKept(handle)
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
func killSession(sid int, leaderStart uint64) { killSessionRounds(sid, leaderStart) }

// killSessionRounds is killSession, saying how many rounds found a live
// process to kill (each followed by a 10 ms sleep): 0 when the session had
// none left.
func killSessionRounds(sid int, leaderStart uint64) int {
	for round := 0; round < 10; round++ {
		found := false
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st, err := readStat(pid)
			// A zombie (the exited agent before it is reaped) cannot be
			// killed again; counting it as alive cost every run all rounds.
			if err != nil || st.session != sid || st.start < leaderStart || st.state == 'Z' {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				found = true
			}
		}
		if !found {
			return round
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 10
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
	st, err := readStat(pid)
	return st.start, err
}

// procStat is what killSession needs of /proc/<pid>/stat.
type procStat struct {
	state   byte // field 3: R, S, D, Z, ...
	session int  // field 6
	start   uint64
}

// readStat reads fields 3 (state), 6 (session id) and 22 (start time) of
// /proc/<pid>/stat.
func readStat(pid int) (procStat, error) {
	session, start, state, err := sessionAndStart(pid)
	return procStat{state: state, session: session, start: start}, err
}

func sessionAndStart(pid int) (int, uint64, byte, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces and
	// parentheses itself; fields after the last ')' start at field 3.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	const sessionIdx, startIdx = 6 - 3, 22 - 3
	if len(fields) <= startIdx {
		return 0, 0, 0, fmt.Errorf("cannot parse /proc/%d/stat: too few fields", pid)
	}
	session, err := strconv.Atoi(fields[sessionIdx])
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cannot parse session of %d: %w", pid, err)
	}
	start, err := strconv.ParseUint(fields[startIdx], 10, 64)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cannot parse start time of %d: %w", pid, err)
	}
	return session, start, fields[0][0], nil
}
