package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/agent/provider"
)

// Shell limits.
const (
	ShellOutputLimit    = 64 << 10 // bytes kept of stdout and of stderr, each
	ShellDefaultTimeout = 60 * time.Second
	ShellMaxTimeout     = 600 * time.Second
	// shellWaitDelay bounds how long output of background processes that
	// outlive the shell is still collected.
	shellWaitDelay = 2 * time.Second
)

// ShellPath is the PATH shell commands get.
const ShellPath = "/usr/local/bin:/usr/bin:/bin"

// ShellResult is the shell tool's output, as JSON.
type ShellResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out,omitempty"`
}

type shell struct{ env Env }

func (shell) Spec() provider.Tool {
	return provider.Tool{
		Name: "shell",
		Description: "Run a command with /bin/sh -c in the workspace. Returns JSON with stdout, stderr and exit_code " +
			"(each stream capped at 64 KiB). timeout is in seconds (default 60, max 600); on timeout the whole process group is killed.",
		Parameters: schema(`{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer","minimum":1,"maximum":600}},"required":["command"],"additionalProperties":false}`),
	}
}

// shellArgs are the shell tool's arguments.
type shellArgs struct {
	Command string `json:"command"`
	Timeout int    `json:"timeout"`
}

// shellArgsOf reads them as Call does: the command a tool ask names is the
// one the shell runs.
func shellArgsOf(raw json.RawMessage) (shellArgs, error) {
	var args shellArgs
	err := decodeArgs(raw, &args)
	return args, err
}

func (s shell) Call(ctx context.Context, raw json.RawMessage) (string, error) {
	args, err := shellArgsOf(raw)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(args.Command) == "" {
		return "", errors.New("bad arguments: command is empty")
	}
	timeout := ShellDefaultTimeout
	if args.Timeout < 0 {
		return "", errors.New("bad arguments: timeout must be positive")
	}
	if args.Timeout > 0 {
		timeout = min(time.Duration(args.Timeout)*time.Second, ShellMaxTimeout)
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", args.Command)
	cmd.Dir = s.env.Workspace
	cmd.Env = append([]string{"PATH=" + ShellPath, "HOME=" + s.env.Workspace, "TMPDIR=" + s.env.TmpDir, "LANG=C.UTF-8"}, s.env.ProxyEnv...)
	cmd.Stdin = strings.NewReader("") // not /dev/null: the sandbox may not allow it
	stdout, stderr := &capped{limit: ShellOutputLimit}, &capped{limit: ShellOutputLimit}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	procs := s.env.processes()
	cmd.Cancel = func() error { return procs.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = shellWaitDelay

	err = procs.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	res := ShellResult{ExitCode: 0}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitCode(exitErr)
	case errors.Is(err, exec.ErrWaitDelay):
		// the shell exited; a background process kept the output open
	default:
		if cmd.ProcessState == nil {
			return "", fmt.Errorf("cannot start /bin/sh: %w", err)
		}
		res.ExitCode = exitCode(&exec.ExitError{ProcessState: cmd.ProcessState})
	}
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		res.TimedOut = true
		fmt.Fprintf(stderr, "\n[timed out after %s; process group killed]", timeout)
	}
	res.Stdout, res.Stderr = CleanText(stdout.String()), CleanText(stderr.String())
	out, err := json.Marshal(res)
	if err != nil {
		return "", fmt.Errorf("cannot encode shell result: %w", err)
	}
	return string(out), nil
}

// exitCode is the shell's exit status, or 128+signal like a shell reports it.
func exitCode(e *exec.ExitError) int {
	if ws, ok := e.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return e.ExitCode()
}
