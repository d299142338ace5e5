package confine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
)

// NonDumpable makes the calling process non-dumpable: no core dump, its
// /proc/<pid> entries owned by root, and no ptrace nor /proc/<pid>/mem,
// environ, maps or fd access by processes of the same uid that lack
// CAP_SYS_PTRACE. The flag belongs to the whole process (all threads) and
// survives Landlock; execve resets it, so it guards berth-agent, not the
// tools it starts. Call it before the request (and its provider key) is read.
func NonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot make berth-agent non-dumpable: %w", err)
	}
	return nil
}

// ToolPolicy is what tools may touch: the agent's policy minus the agent's
// own /proc entry (its /proc/self and /proc/thread-self resolve into it),
// denied so that even a policy allowing /proc or / as a whole leaves it
// out. The agent keeps no files of its own for tools to lose: the request
// comes on stdin and the response goes to stdout.
func ToolPolicy(agent agentproto.Policy, agentPID int) agentproto.Policy {
	tools := agent
	tools.Deny = append(append([]string(nil), agent.Deny...), fmt.Sprintf("/proc/%d", agentPID))
	return tools
}

// ToolLauncherArg, as berth-agent's first argument, makes it the tool
// launcher (see LaunchTool) instead of an agent.
const ToolLauncherArg = "__berth_tool_launcher"

// toolRulesetFD is where a launched tool finds the tools' Landlock ruleset
// (the first of exec.Cmd.ExtraFiles).
const toolRulesetFD = 3

// Exit codes of the tool launcher, as a shell reports a command it cannot run.
const (
	LaunchRefused  = 126 // the tools' confinement could not be applied; nothing ran
	LaunchNotFound = 127 // the tool's program could not be executed
)

// Launcher starts tool processes inside the tools' own nested Landlock
// domain. Go's os/exec has no hook between fork and exec, and a domain
// applied to a thread of berth-agent would leave that thread — part of the
// agent, sharing its memory — inside the tools' domain, where they could
// trace it. So each tool process first execs berth-agent itself as the tool
// launcher: a fresh program holding no secret, which restricts its own
// thread with the ruleset it inherits on fd 3, closes it and execs the tool.
// No thread of the agent is in the tools' domain or below it, and Landlock
// refuses ptrace (and /proc/<pid>/mem, environ, fd) from a domain into any
// process outside it, whatever the uid or capabilities.
//
// Before ABI 8 each thread of the agent has a Landlock domain of its own
// (go-landlock restricts them one by one), and a scoped domain may only
// signal processes in or beneath its own. So one locked thread forks every
// tool and sends every signal to them: the tools' domain lies beneath that
// thread's, and a timeout's kill is never refused.
type Launcher struct {
	ruleset *os.File
	flags   uint32
	calls   chan func()
}

func newLauncher(ruleset *os.File, flags uint32) *Launcher {
	l := &Launcher{ruleset: ruleset, flags: flags, calls: make(chan func())}
	go func() {
		// Never unlocked: a locked goroutine that returned would take its
		// thread (and the domain tools were forked from) down with it.
		runtime.LockOSThread()
		for call := range l.calls {
			call()
		}
	}()
	return l
}

// do runs fn on the launcher's thread and waits for it.
func (l *Launcher) do(fn func()) {
	done := make(chan struct{})
	l.calls <- func() { defer close(done); fn() }
	<-done
}

// Start starts cmd through the tool launcher, from the launcher's thread;
// the command's path, arguments, environment and directory stay as they
// were. On a nil Launcher (an unrestricted run) it is cmd.Start.
func (l *Launcher) Start(cmd *exec.Cmd) error {
	if l == nil {
		return cmd.Start()
	}
	args := append([]string{"berth-agent", ToolLauncherArg, strconv.FormatUint(uint64(l.flags), 10), cmd.Path}, cmd.Args...)
	cmd.Path, cmd.Args = "/proc/self/exe", args
	cmd.ExtraFiles = append([]*os.File{l.ruleset}, cmd.ExtraFiles...)
	var err error
	l.do(func() { err = cmd.Start() })
	return err
}

// Kill sends sig to pid (a process group when negative) from the
// launcher's thread. On a nil Launcher it is syscall.Kill.
func (l *Launcher) Kill(pid int, sig syscall.Signal) error {
	if l == nil {
		return syscall.Kill(pid, sig)
	}
	var err error
	l.do(func() { err = syscall.Kill(pid, sig) })
	return err
}

// LaunchTool is the tool launcher: args are FLAGS PATH ARGV0 ARGS... It
// restricts the calling thread with the ruleset on fd 3 (and no_new_privs),
// closes fd 3 and execs PATH with ARGV0 ARGS... and the environment it was
// given. It returns only on failure, with LaunchRefused when the
// confinement could not be applied (nothing ran) and LaunchNotFound when
// PATH could not be executed; the reason goes to stderr.
func LaunchTool(args []string, stderr io.Writer) int {
	// Restriction and execve must happen on one thread: the new program
	// inherits the credentials of the thread that execs it.
	runtime.LockOSThread()
	if len(args) < 3 {
		fmt.Fprintln(stderr, "berth tool launcher: usage: FLAGS PATH ARGV0 [ARGS...]")
		return LaunchRefused
	}
	if err := restrictThread(args[0]); err != nil {
		fmt.Fprintf(stderr, "berth tool launcher: refusing to run %s: %v\n", args[1], err)
		return LaunchRefused
	}
	err := syscall.Exec(args[1], args[2:], os.Environ())
	fmt.Fprintf(stderr, "berth tool launcher: cannot run %s: %v\n", args[1], err)
	return LaunchNotFound
}

// restrictThread applies the ruleset on fd 3 to the calling thread.
func restrictThread(flagText string) error {
	flags, err := strconv.ParseUint(flagText, 10, 32)
	if err != nil {
		return fmt.Errorf("cannot read Landlock flags %q: %w", flagText, err)
	}
	defer unix.Close(toolRulesetFD)
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot set no_new_privs: %w", err)
	}
	if err := ll.LandlockRestrictSelf(toolRulesetFD, uint32(flags)); err != nil {
		if errors.Is(err, unix.EBADF) || errors.Is(err, unix.EBADFD) {
			return errors.New("no Landlock ruleset on fd 3 (the launcher only runs tools of berth-agent)")
		}
		return fmt.Errorf("cannot restrict the tool with Landlock: %w", err)
	}
	return nil
}
