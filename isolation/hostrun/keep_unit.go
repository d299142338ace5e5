package hostrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// Under systemd a kept host sandbox is a transient service of its own,
// berth-sandbox-<sandbox id>.service in berth-runs.slice, with a run unit's
// limits and sandboxing (unitProperties) and three differences: berth-agent
// runs in serve mode, no RuntimeMaxSec (the plan's timeout bounds each
// request, the scheduler the sandbox's life), and no RemainAfterExit. The
// agent exits at EOF on its stdin, so a scheduler that dies takes the
// sandbox with it as Pdeathsig does without systemd: the unit then stops,
// and its KillMode=control-group ends what the tools left (SIGTERM, then
// SIGKILL after TimeoutStopSec, the plan's kill grace).

// SandboxUnitPrefix starts the name of every kept host sandbox's unit.
const SandboxUnitPrefix = "berth-sandbox-"

// unitPoll is how often a stopping sandbox's unit is asked whether a
// process is left in it.
const unitPoll = 20 * time.Millisecond

// SandboxUnitName is the transient unit of the kept host sandbox id.
func SandboxUnitName(id string) string {
	return SandboxUnitPrefix + unit.UnitNameEscape(id) + ".service"
}

// keptUnitProperties are a run unit's properties for a kept sandbox.
func keptUnitProperties(u unitRun, name string, stdin, stdout, stderr int) []sdbus.Property {
	u.spec.Timeout = 0 // no RuntimeMaxSec: the sandbox lives until it is stopped
	grace := u.spec.KillGrace
	if grace <= 0 {
		grace = isolation.DefaultKillGrace
	}
	var props []sdbus.Property
	for _, p := range unitProperties(u, name, stdin, stdout, stderr) {
		switch p.Name {
		case "Description":
			p = sdbus.PropDescription(fmt.Sprintf("berth sandbox %s (agent %s)", u.spec.RunID, u.spec.AgentID))
		case "ExecStart":
			p = sdbus.PropExecStart(append(unitCommand(u), agentproto.ServeArg), true)
		case "RemainAfterExit":
			p = sdbus.PropRemainAfterExit(false)
		}
		props = append(props, p)
	}
	return append(props, prop("TimeoutStopUSec", uint64(grace/time.Microsecond)))
}

// startKeptUnit is Start under systemd.
func startKeptUnit(ctx context.Context, spec isolation.Spec, cred *syscall.Credential) (isolation.Kept, error) {
	name := SandboxUnitName(spec.RunID)
	// Not ctx itself: godbus closes a connection when its context is done,
	// and the sandbox needs this one until it is released.
	conn, err := sdbus.NewSystemdConnectionContext(context.WithoutCancel(ctx))
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot connect to systemd", Err: err}
	}
	// A unit left under this name (a scheduler that died before it could
	// record it) must not block the sandbox.
	stopUnit(ctx, conn, name)
	job := make(chan string, 1)
	stdinW, stdoutR, stderrR, err := startUnitOnPipes(ctx, conn, name, job, func(in, out, errFd int) []sdbus.Property {
		return keptUnitProperties(newUnitRun(spec, nil, cred), name, in, out, errFd)
	})
	if err != nil {
		return nil, err
	}
	out := isolation.NewKeptOutput()
	body := &keptUnit{conn: conn, name: name, stdoutR: stdoutR, stderrR: stderrR, exited: make(chan struct{})}
	go func() { _, _ = io.Copy(out.Stdout(), stdoutR) }()
	go func() { _, _ = io.Copy(out.Stderr(), stderrR) }()
	go body.watch(job)
	return isolation.OpenKept(ctx, spec, body, stdinW, out)
}

// keptUnit is a kept sandbox's transient unit (isolation.KeptBody).
type keptUnit struct {
	conn             *sdbus.Conn
	name             string
	stdoutR, stderrR *os.File

	exited  chan struct{}
	exit    isolation.Exit
	release sync.Once
}

// watch closes exited once the agent, the unit's main process, has ended:
// it waits on a pidfd, not by asking systemd over and over for the whole
// life of the sandbox.
func (k *keptUnit) watch(job <-chan string) {
	defer close(k.exited)
	select {
	case <-job: // done once the agent was executed (Type=exec), or failed
	case <-time.After(unitCallTimeout):
	}
	ctx, cancel := context.WithTimeout(context.Background(), unitCallTimeout)
	pid := k.mainPID(ctx)
	cancel()
	if pid > 0 {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			// The pid could have been reused before the open: it is the
			// agent only if the unit still names it.
			ctx, cancel := context.WithTimeout(context.Background(), unitCallTimeout)
			same := k.mainPID(ctx) == pid
			cancel()
			if same {
				waitPidfd(fd)
			}
			unix.Close(fd)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), unitCallTimeout)
	defer cancel()
	end := waitUnitEnd(ctx, k.conn, k.name)
	switch {
	case end.err == nil:
		k.exit = exitOf(end, k.name)
	case k.unloaded(ctx):
		// Only a clean exit leaves no unit behind: a failed one stays
		// loaded (failed) until it is reset.
		k.exit = isolation.Exit{}
	default:
		k.exit = isolation.Exit{Code: -1}
	}
}

// mainPID is the unit's main process, 0 when it has none (yet, or any more).
func (k *keptUnit) mainPID(ctx context.Context) int {
	p, err := k.conn.GetUnitTypePropertyContext(ctx, k.name, "Service", "MainPID")
	if err != nil {
		return 0
	}
	pid, _ := p.Value.Value().(uint32)
	return int(pid)
}

func (k *keptUnit) unloaded(ctx context.Context) bool {
	p, err := k.conn.GetUnitPropertyContext(ctx, k.name, "LoadState")
	if err != nil {
		return false
	}
	s, _ := p.Value.Value().(string)
	return s == "not-found"
}

// waitPidfd blocks until the process of fd has exited.
func waitPidfd(fd int) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

func (k *keptUnit) Handle() string                      { return unitHandlePrefix + k.name }
func (k *keptUnit) Exited() <-chan struct{}             { return k.exited }
func (k *keptUnit) ExitStatus() isolation.Exit          { return k.exit }
func (k *keptUnit) Terminate(ctx context.Context) error { return k.signal(ctx, syscall.SIGTERM) }

// Kill SIGKILLs every process of the unit; a unit already gone is not an
// error (Release stops it either way).
func (k *keptUnit) Kill(ctx context.Context) error {
	_ = k.signal(ctx, syscall.SIGKILL)
	return nil
}

// signal sends sig to every process of the unit.
func (k *keptUnit) signal(ctx context.Context, sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(ctx, unitCallTimeout)
	defer cancel()
	if err := k.conn.KillUnitWithTarget(ctx, k.name, sdbus.All, int32(sig)); err != nil {
		return fmt.Errorf("cannot send %s to the sandbox's unit %s: %w", sig, k.name, err)
	}
	return nil
}

// WaitEnded returns once the agent has exited and the unit holds no task
// (or is gone).
func (k *keptUnit) WaitEnded(ctx context.Context) error {
	select {
	case <-k.exited:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		p, err := k.conn.GetUnitTypePropertyContext(ctx, k.name, "Service", "TasksCurrent")
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return nil
		}
		// An inactive unit reports no count (the maximum uint64).
		if n, _ := p.Value.Value().(uint64); n == 0 || n == ^uint64(0) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(unitPoll):
		}
	}
}

// OOMKilled reads how systemd says the unit ended.
func (k *keptUnit) OOMKilled(ctx context.Context) bool {
	p, err := k.conn.GetUnitTypePropertyContext(ctx, k.name, "Service", "Result")
	if err != nil {
		return false
	}
	s, _ := p.Value.Value().(string)
	return s == "oom-kill"
}

// Memory is the unit's memory use (every process of it and the page cache
// it caused, its /tmp included).
func (k *keptUnit) Memory(ctx context.Context) (int64, error) {
	p, err := k.conn.GetUnitTypePropertyContext(ctx, k.name, "Service", "MemoryCurrent")
	if err != nil {
		return 0, fmt.Errorf("cannot read the sandbox's memory: %w", err)
	}
	n, _ := p.Value.Value().(uint64)
	if n == ^uint64(0) {
		return 0, fmt.Errorf("cannot read the sandbox's memory: unit %s reports none", k.name)
	}
	return int64(n), nil
}

// Release stops the unit (what is left of it) and frees its name.
func (k *keptUnit) Release() {
	k.release.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), unitCallTimeout)
		defer cancel()
		stopUnit(ctx, k.conn, k.name)
		k.stdoutR.Close()
		k.stderrR.Close()
		k.conn.Close()
	})
}
