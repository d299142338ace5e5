package hostrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/isolation"
)

// Under systemd a host run is a transient service, berth-run-<run id>-<attempt>.service
// in berth-runs.slice, started by PID 1 through its private D-Bus socket
// (root only). The unit gets the cgroup limits (MemoryMax, TasksMax,
// CPUQuota, RuntimeMaxSec) and the sandboxing (ProtectSystem=strict,
// NoNewPrivileges, PrivateNetwork, TemporaryFileSystem over the host's socket
// directories, the egress directories of other runs and /tmp and /var/tmp —
// size-limited, which PrivateTmp is not — PrivateIPC) of a hardened service; the agent
// still confines itself with Landlock and its syscall filter inside it.
//
// The request carries the provider key, so it must reach the agent's stdin
// and nothing else: the runner makes three pipes and hands their far ends to
// systemd as StandardInputFileDescriptor, StandardOutputFileDescriptor and
// StandardErrorFileDescriptor (file descriptors travel over the D-Bus socket
// with SCM_RIGHTS). The unit's properties hold no part of the request.

const (
	// UnitPrefix starts the name of every host run unit.
	UnitPrefix = "berth-run-"
	// RunsSlice holds the host run units; limits on it cap all runs together.
	RunsSlice = "berth-runs.slice"
	// unitHandlePrefix marks handles of runs that are transient units.
	unitHandlePrefix = "unit:"
	// systemdPrivateSocket is PID 1's D-Bus socket; only root may connect.
	systemdPrivateSocket = "/run/systemd/private"
	// runtimeGrace is how much longer than the run's timeout systemd lets a
	// unit live (RuntimeMaxSec): a backstop for when the scheduler is gone.
	runtimeGrace = 30 * time.Second
	// unitCallTimeout bounds one call to systemd.
	unitCallTimeout = 30 * time.Second
)

// Limits are the resource limits of one host run.
type Limits struct {
	MemoryMax       uint64 // bytes
	TasksMax        uint64 // processes and threads
	CPUQuotaPercent uint64 // of one CPU
}

// limitsOf is a plan's limits in the units systemd, cgroups and rlimits
// take. It defaults nothing: config and runplan did, once, and Run and
// Start refuse a plan that lacks a limit (isolation.Plan.RequireLimits).
func limitsOf(l isolation.Limits) Limits {
	out := Limits{MemoryMax: uint64(max(l.MemoryBytes, 0)), TasksMax: uint64(max(l.Pids, 0))}
	if l.NanoCPUs > 0 {
		out.CPUQuotaPercent = max(1, uint64(l.NanoCPUs/10_000_000))
	}
	return out
}

// SystemdAvailable reports whether host runs become transient units: systemd
// is the init system and this process may talk to it (it is root).
func SystemdAvailable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	if fi, err := os.Stat("/run/systemd/system"); err != nil || !fi.IsDir() {
		return false
	}
	_, err := os.Stat(systemdPrivateSocket)
	return err == nil
}

// UnitName is the transient unit of a run.
func UnitName(runID string) string {
	return UnitPrefix + unit.UnitNameEscape(runID) + ".service"
}

// attemptUnitName is the transient unit of one attempt of a run:
// isolation.AttemptName's spelling, its "-" left unescaped so that
// systemctl shows berth-run-<run id>-<attempt>.service.
func attemptUnitName(runID string, attempt int) string {
	if attempt <= 0 {
		return UnitName(runID)
	}
	return UnitPrefix + unit.UnitNameEscape(runID) + "-" + strconv.Itoa(attempt) + ".service"
}

// unitRun is what startUnit needs besides the spec.
type unitRun struct {
	spec  isolation.Spec
	input []byte
	cred  *syscall.Credential // nil: as root (unrestricted only)
	// setpriv: the uid has no passwd entry, so the unit switches to it
	// through setpriv instead of User= (nameless).
	setpriv    bool
	cutNetwork bool
	confine    bool // the sandboxing properties (not for unrestricted runs)
	readWrite  []string
	readOnly   []string
}

func newUnitRun(spec isolation.Spec, input []byte, cred *syscall.Credential) unitRun {
	return unitRun{
		spec:       spec,
		input:      input,
		cred:       cred,
		setpriv:    cred != nil && nameless(cred.Uid),
		cutNetwork: !spec.Policy.Network,
		confine:    !spec.Policy.Unrestricted,
		readWrite:  unmasked(append([]string{spec.Workspace}, spec.Policy.AllowReadWrite...), masks(spec.Plan)),
		readOnly:   unmasked(spec.Policy.AllowRead, masks(spec.Plan)),
	}
}

// startUnit starts the agent as a transient unit with the request waiting
// on its stdin.
func startUnit(ctx context.Context, u unitRun, stdout, stderr io.Writer) (isolation.Sandbox, error) {
	name := attemptUnitName(u.spec.RunID, u.spec.Attempt)
	// Not ctx itself: godbus closes a connection when its context is done,
	// and a canceled run still needs this one to stop its unit.
	conn, err := sdbus.NewSystemdConnectionContext(context.WithoutCancel(ctx))
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot connect to systemd", Err: err}
	}
	// Units left by earlier attempts of this run (a scheduler that died
	// before their handle was committed) end now, and a unit left under
	// this very name must not block it.
	for n := range u.spec.Attempt + 1 {
		stopUnit(ctx, conn, attemptUnitName(u.spec.RunID, n))
	}
	stdinW, stdoutR, stderrR, err := startUnitOnPipes(ctx, conn, name, nil, func(in, out, errFd int) []sdbus.Property {
		return unitProperties(u, name, in, out, errFd)
	})
	if err != nil {
		return nil, err
	}
	s := &unitSandbox{conn: conn, name: name, stdinW: stdinW, stdoutR: stdoutR, stderrR: stderrR, drained: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = stdinW.Write(u.input)
		stdinW.Close()
	})
	wg.Go(func() { _, _ = io.Copy(stdout, stdoutR) })
	wg.Go(func() { _, _ = io.Copy(stderr, stderrR) })
	go func() {
		wg.Wait()
		close(s.drained)
	}()
	return s, nil
}

// unitSandbox is a run's transient unit.
type unitSandbox struct {
	conn                     *sdbus.Conn
	name                     string
	stdinW, stdoutR, stderrR *os.File
	drained                  chan struct{}
	release                  sync.Once
}

func (s *unitSandbox) Handle() string { return unitHandlePrefix + s.name }

// Wait polls the unit until its main process has exited and reads how.
func (s *unitSandbox) Wait(ctx context.Context) (isolation.Exit, error) {
	end := waitUnitEnd(ctx, s.conn, s.name)
	if end.err != nil {
		return isolation.Exit{Code: -1}, &isolation.RunError{Reason: isolation.ReasonCrashed, Detail: "lost track of unit " + s.name, Err: end.err}
	}
	return exitOf(end, s.name), nil
}

// exitOf maps how systemd says a unit ended to how the agent ended.
func exitOf(end unitEnd, name string) isolation.Exit {
	exit := isolation.Exit{Code: end.exitCode()}
	switch {
	case end.result == "oom-kill":
		exit.OOM = true
	case end.result == "timeout":
		exit.RuntimeLimit = true
	case end.code == cldExited && end.status >= 200 && end.status < 256:
		// systemd's own exit codes (EXIT_USER, EXIT_EXEC, ...): the agent
		// never ran.
		exit.NeverRan = fmt.Sprintf("systemd could not start the agent in %s (exit status %d, see journalctl -u %s)", name, end.status, name)
	case end.code == cldKilled || end.code == cldDumped:
		exit.Signal = syscall.Signal(end.status)
	}
	if exit.Signal != 0 || exit.OOM {
		exit.Code = -1
	}
	return exit
}

// Kill stops the unit: that ends whatever the agent left running (the whole
// cgroup) and frees the name; after that the pipes reach EOF.
func (s *unitSandbox) Kill(ctx context.Context) error {
	stopUnit(ctx, s.conn, s.name)
	return nil
}

func (s *unitSandbox) Drained() <-chan struct{} { return s.drained }

// Inspect: systemd reports an OOM kill itself (Result=oom-kill, in Wait).
func (s *unitSandbox) Inspect(context.Context, bool) bool { return false }

func (s *unitSandbox) Release() {
	s.release.Do(func() {
		s.stdoutR.Close()
		s.stderrR.Close()
		s.stdinW.Close()
		s.conn.Close()
	})
}

func unitProperties(u unitRun, name string, stdin, stdout, stderr int) []sdbus.Property {
	lim := limitsOf(u.spec.Limits)
	props := []sdbus.Property{
		sdbus.PropDescription(fmt.Sprintf("berth run %s (agent %s)", u.spec.RunID, u.spec.AgentID)),
		sdbus.PropType("exec"),
		sdbus.PropSlice(RunsSlice),
		sdbus.PropExecStart(unitCommand(u), true),
		// The unit stays loaded after the agent exits so its exit status
		// can be read; the runner stops it right after.
		sdbus.PropRemainAfterExit(true),
		prop("WorkingDirectory", u.spec.Workspace),
		prop("Environment", Environment(u.spec.Workspace)),
		prop("StandardInputFileDescriptor", dbus.UnixFD(stdin)),
		prop("StandardOutputFileDescriptor", dbus.UnixFD(stdout)),
		prop("StandardErrorFileDescriptor", dbus.UnixFD(stderr)),
		prop("KillMode", "control-group"),
		prop("MemoryAccounting", true),
		prop("MemoryMax", lim.MemoryMax),
		prop("MemorySwapMax", uint64(0)),
		prop("TasksAccounting", true),
		prop("TasksMax", lim.TasksMax),
		prop("CPUAccounting", true),
		prop("CPUQuotaPerSecUSec", lim.CPUQuotaPercent*10000),
		prop("LimitCORE", uint64(0)),
		prop("LimitCORESoft", uint64(0)),
	}
	if u.spec.Timeout > 0 {
		props = append(props, prop("RuntimeMaxUSec", uint64((u.spec.Timeout+runtimeGrace)/time.Microsecond)))
	}
	if u.cred != nil && !u.setpriv {
		props = append(props,
			prop("User", strconv.FormatUint(uint64(u.cred.Uid), 10)),
			prop("Group", strconv.FormatUint(uint64(u.cred.Gid), 10)),
		)
	}
	if u.confine {
		readWrite := append(egressDirs(u.spec.Plan), u.readWrite...)
		props = append(props,
			prop("NoNewPrivileges", true),
			prop("ProtectSystem", "strict"),
			prop("ProtectKernelTunables", true),
			prop("ProtectKernelModules", true),
			prop("ProtectControlGroups", true),
			prop("RestrictSUIDSGID", true),
			prop("LockPersonality", true),
			// Bind mounts, not ReadWritePaths: they also show paths under
			// the run's own /tmp. "-" paths may be missing.
			prop("BindPaths", bindPaths(readWrite)),
			prop("BindReadOnlyPaths", bindPaths(without(append(append([]string{u.spec.AgentBinary}, u.readOnly...), boundBack(u.spec.Plan)...), readWrite))),
			// The host's socket directories, /tmp and /var/tmp are empty
			// (only the binds above show what the plan names inside them),
			// SysV IPC is the run's own, and so is its session keyring.
			prop("TemporaryFileSystem", unitMasks(u.spec.Plan)),
			prop("PrivateIPC", true),
			prop("KeyringMode", "private"),
		)
	}
	// The network follows allow_network for every run, unrestricted ones too:
	// "unrestricted" lifts the file sandbox, not the network policy.
	if u.cutNetwork {
		props = append(props, prop("PrivateNetwork", true))
	}
	return props
}

// bindPath is one entry of BindPaths/BindReadOnlyPaths (D-Bus signature
// (ssbt)): source, destination, ignore a missing source, mount flags.
type bindPath struct {
	Source, Destination string
	IgnoreMissing       bool
	Flags               uint64
}

// egressDirs is the run's egress socket directory, which the unit must show
// even when it lies under /tmp, a protected directory or the mask over every
// run's egress directory.
func egressDirs(p isolation.Plan) []string {
	if p.Egress == nil {
		return nil
	}
	return []string{filepath.Dir(p.Egress.SandboxSocket)}
}

// without is paths less those in drop (a path bound read-write is not
// bound read-only too).
func without(paths, drop []string) []string {
	dropped := map[string]bool{}
	for _, d := range drop {
		dropped[filepath.Clean(d)] = true
	}
	var out []string
	for _, p := range paths {
		if !dropped[filepath.Clean(p)] {
			out = append(out, p)
		}
	}
	return out
}

func bindPaths(paths []string) []bindPath {
	out := []bindPath{}
	seen := map[string]bool{}
	for _, p := range paths {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || seen[p] || p == "/" {
			continue
		}
		seen[p] = true
		out = append(out, bindPath{Source: p, Destination: p, IgnoreMissing: true, Flags: syscall.MS_REC})
	}
	return out
}

func prop(name string, value any) sdbus.Property {
	return sdbus.Property{Name: name, Value: dbus.MakeVariant(value)}
}

// Exit codes of ExecMainCode (siginfo si_code).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// unitEnd is how a run's unit ended.
type unitEnd struct {
	code   int32  // ExecMainCode
	status int32  // ExecMainStatus: exit status or signal
	result string // Result: success, exit-code, signal, oom-kill, timeout, ...
	err    error
}

func (e unitEnd) exitCode() int {
	if e.code == cldExited {
		return int(e.status)
	}
	return -1
}

// waitUnitEnd polls the unit until its main process has exited.
func waitUnitEnd(ctx context.Context, conn *sdbus.Conn, name string) unitEnd {
	delay := 10 * time.Millisecond
	for {
		props, err := conn.GetUnitPropertiesContext(ctx, name)
		if err != nil {
			return unitEnd{err: err}
		}
		active, _ := props["ActiveState"].(string)
		sub, _ := props["SubState"].(string)
		// Right after StartTransientUnit the unit is inactive with its
		// start job still queued; inactive counts as an end only once no
		// job is pending.
		if active == "failed" || (active == "inactive" && !hasJob(props)) || (active == "active" && sub == "exited") {
			svc, err := conn.GetUnitTypePropertiesContext(ctx, name, "Service")
			if err != nil {
				return unitEnd{err: err}
			}
			end := unitEnd{}
			end.code, _ = svc["ExecMainCode"].(int32)
			end.status, _ = svc["ExecMainStatus"].(int32)
			end.result, _ = svc["Result"].(string)
			if end.code == 0 {
				return unitEnd{err: fmt.Errorf("unit %s is %s/%s and reports no exit status", name, active, sub)}
			}
			return end
		}
		select {
		case <-ctx.Done():
			return unitEnd{err: ctx.Err()}
		case <-time.After(delay):
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// hasJob reports whether the unit has a job queued or running (its Job
// property, (uo), has a non-zero id).
func hasJob(props map[string]any) bool {
	job, ok := props["Job"].([]any)
	if !ok || len(job) == 0 {
		return false
	}
	id, _ := job[0].(uint32)
	return id != 0
}

// stopUnit stops the unit (killing its whole cgroup), waits until it is
// inactive and clears a failed state, so the name is free again. A unit
// that is not there is not an error.
func stopUnit(ctx context.Context, conn *sdbus.Conn, name string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := conn.StopUnitContext(ctx, name, "replace", nil); err == nil {
		delay := 10 * time.Millisecond
		for {
			p, err := conn.GetUnitPropertyContext(ctx, name, "ActiveState")
			if err != nil {
				break
			}
			if s, _ := p.Value.Value().(string); s == "inactive" || s == "failed" {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			if ctx.Err() != nil {
				break
			}
			delay = min(delay*2, 200*time.Millisecond)
		}
	}
	_ = conn.ResetFailedUnitContext(ctx, name)
}

// killUnit is Kill for a run that is a transient unit.
func killUnit(ctx context.Context, handle string) error {
	name := strings.TrimPrefix(handle, unitHandlePrefix)
	if !strings.HasPrefix(name, UnitPrefix) && !strings.HasPrefix(name, SandboxUnitPrefix) || !strings.HasSuffix(name, ".service") {
		return fmt.Errorf("cannot kill %q: not a berth run unit", handle)
	}
	conn, err := sdbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("cannot connect to systemd to stop %s: %w", name, err)
	}
	defer conn.Close()
	stopUnit(ctx, conn, name)
	return nil
}

// setprivPath is util-linux's setpriv (essential on Debian and Fedora).
var setprivPath = "/usr/bin/setpriv"

// nameless says uid has no passwd entry, as an agent's own uid from
// [scheduler] agent_uids has not. systemd's User= needs an entry for a
// numeric uid too (the unit would fail with 217/USER), so such a unit
// starts the agent through setpriv, which switches to the bare ids and
// drops every capability before executing it.
func nameless(uid uint32) bool {
	_, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	return err != nil
}

// unitCommand is the unit's ExecStart.
func unitCommand(u unitRun) []string {
	if !u.setpriv {
		return []string{u.spec.AgentBinary}
	}
	uid := strconv.FormatUint(uint64(u.cred.Uid), 10)
	gid := strconv.FormatUint(uint64(u.cred.Gid), 10)
	return []string{setprivPath, "--reuid=" + uid, "--regid=" + gid, "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--", u.spec.AgentBinary}
}

// startUnitOnPipes starts the transient unit name with its stdin, stdout
// and stderr on new pipes (props gets their descriptors) and returns the
// ends berth keeps. systemd holds its own copies once it has the unit, so
// the unit's ends are closed here; on an error everything is, conn too.
func startUnitOnPipes(ctx context.Context, conn *sdbus.Conn, name string, job chan<- string, props func(stdin, stdout, stderr int) []sdbus.Property) (stdinW, stdoutR, stderrR *os.File, err error) {
	weighSlice(ctx, conn)
	var pipes [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	closeAll := func() {
		for _, f := range pipes {
			if f != nil {
				f.Close()
			}
		}
		conn.Close()
	}
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, nil, nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot create pipes", Err: err}
		}
		pipes[2*i], pipes[2*i+1] = r, w
	}
	stdinR, stdoutW, stderrW := pipes[0], pipes[3], pipes[5]
	startCtx, cancel := context.WithTimeout(ctx, unitCallTimeout)
	_, startErr := conn.StartTransientUnitContext(startCtx, name, "fail", props(int(stdinR.Fd()), int(stdoutW.Fd()), int(stderrW.Fd())), job)
	cancel()
	// systemd holds its own copies now; ours would keep the pipes open.
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if startErr != nil {
		pipes[1].Close()
		pipes[2].Close()
		pipes[4].Close()
		conn.Close()
		return nil, nil, nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "systemd refused the transient unit " + name, Err: startErr}
	}
	return pipes[1], pipes[2], pipes[4], nil
}
