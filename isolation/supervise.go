package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Sandbox is one started run, as its backend sees it. Supervise drives it;
// the backend only says how to wait for, kill and inspect it.
type Sandbox interface {
	// Handle is what Backend.Kill understands, for OnStart.
	Handle() string
	// Wait blocks until the agent's main process has ended and says how.
	// An error means the backend lost track of the sandbox (it may be a
	// *RunError with the backend's own reason).
	Wait(ctx context.Context) (Exit, error)
	// Kill ends every process of the sandbox now. It is called after every
	// run, normal ends included (it then ends what tools left behind), and
	// must not fail for a sandbox that is gone.
	Kill(ctx context.Context) error
	// Drained is closed once the agent's stdout and stderr were read to the
	// end.
	Drained() <-chan struct{}
	// Inspect tells, after the end, whether the kernel OOM-killed a process
	// of the sandbox; suspect says something died of SIGKILL, so the backend
	// may ask again for a little while.
	Inspect(ctx context.Context, suspect bool) (oomKilled bool)
	// Release frees what is left: the output streams (so Drained closes),
	// the container, the unit. It is called once Supervise is done, or
	// early when output is not drained within the grace period.
	Release()
}

// BackgroundEnder is a Sandbox that may end after its run has returned.
// When, before the sandbox is seen to exit, the agent's response is
// complete on stdout and its log on stderr (its ResponseFollows line), the
// response is this run's, and no tool died of SIGKILL (a possible OOM
// kill), Supervise returns the run's Result at once and hands what is left
// — kill, wait for the exit, drain, the OOM check, Release — to
// EndsInBackground. The backend runs it where it can wait for it (its
// Drain) and logs the error it returns (an OOM kill found only then
// included); a crash before it ran leaves the sandbox to the backend's
// orphan sweep. Every other run ends as it always did.
//
// Host runs do not opt in: when their Run returns, no process of theirs is
// left.
type BackgroundEnder interface {
	Sandbox
	EndsInBackground(teardown func() error)
}

// StartFunc starts a spec's sandbox with input waiting on the agent's stdin
// and its stdout and stderr going to the writers. An error is a *RunError
// (or is reported as ReasonStart).
type StartFunc func(ctx context.Context, spec Spec, input []byte, stdout, stderr io.Writer) (Sandbox, error)

// Exit is how a sandbox's agent ended.
type Exit struct {
	// Code is the exit status, -1 when a signal ended it.
	Code   int
	Signal syscall.Signal
	// OOM says the kernel's OOM killer ended a process of the sandbox.
	OOM bool
	// RuntimeLimit says the sandbox's own backstop (RuntimeMaxSec) ended it.
	RuntimeLimit bool
	// NeverRan says why the sandbox could not start the agent at all.
	NeverRan string
}

// waited is what Sandbox.Wait returned.
type waited struct {
	exit Exit
	err  error
}

// Defaults of the supervisor.
const (
	// DefaultKillGrace is how long output is drained after the agent ended
	// when the plan says nothing.
	DefaultKillGrace = 2 * time.Second
	// killTimeout bounds Kill and Inspect, which run even when the run's
	// context is done.
	killTimeout = 30 * time.Second
)

// Supervise runs spec in the sandbox start makes: it hands the request over,
// records the handle, enforces the timeout and cancellation, kills and
// drains, and maps what happened to the run's Result or *RunError. It is the
// one place those decisions are made for every backend.
//
// Known secrets (the plan's provider keys, the run's egress token) are
// replaced by "[redacted]" in what it returns: reply, tool calls, errors and
// the stderr tail, so a tool that printed a key does not put it into the run
// record, the reply or a log.
func Supervise(ctx context.Context, spec Spec, start StartFunc) (Result, error) {
	res, err := supervise(ctx, spec, start)
	return redact(spec, res, err)
}

// Redacted replaces a secret berth knows of.
const Redacted = "[redacted]"

// minSecret: shorter values are not redacted (they would match everywhere).
const minSecret = 8

// knownSecrets are the secrets of spec that redact replaces.
func knownSecrets(spec Spec) []string {
	var secrets []string
	for _, pr := range spec.Providers {
		if len(pr.Key) >= minSecret {
			secrets = append(secrets, pr.Key)
		}
	}
	if len(spec.EgressToken) >= minSecret {
		secrets = append(secrets, spec.EgressToken)
	}
	if len(spec.EgressAgentToken) >= minSecret {
		secrets = append(secrets, spec.EgressAgentToken)
	}
	if spec.Egress != nil {
		for _, s := range spec.Egress.Secrets {
			if len(s.Value) >= minSecret {
				secrets = append(secrets, s.Value)
			}
		}
	}
	return secrets
}

func redact(spec Spec, res Result, err error) (Result, error) {
	secrets := knownSecrets(spec)
	if len(secrets) == 0 {
		return res, err
	}
	clean := func(s string) string {
		for _, secret := range secrets {
			s = strings.ReplaceAll(s, secret, Redacted)
		}
		return s
	}
	r := &res.Response
	r.Reply, r.Error = clean(r.Reply), clean(r.Error)
	if len(r.ToolCalls) > 0 {
		calls := make([]agentproto.ToolCall, len(r.ToolCalls))
		for i, tc := range r.ToolCalls {
			tc.Output, tc.Error = clean(tc.Output), clean(tc.Error)
			if len(tc.Args) > 0 {
				tc.Args = json.RawMessage(clean(string(tc.Args)))
			}
			calls[i] = tc
		}
		r.ToolCalls = calls
	}
	if len(r.MCP) > 0 {
		// A server's error line may quote what the sandbox was given.
		servers := slices.Clone(r.MCP)
		for i := range servers {
			servers[i].Error = clean(servers[i].Error)
		}
		r.MCP = servers
	}
	res.Stderr = clean(res.Stderr)
	var re *RunError
	if errors.As(err, &re) {
		re.Detail = clean(re.Detail)
	}
	return res, err
}

func supervise(ctx context.Context, spec Spec, start StartFunc) (Result, error) {
	input, err := spec.Input()
	if err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, &RunError{Reason: ReasonCanceled, Err: context.Cause(ctx)}
	}
	stdout := NewStdout()
	stderr := NewTail()
	sb, err := start(ctx, spec, input, stdout, withProgress(ctx, spec, stderr))
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, &RunError{Reason: ReasonCanceled, Detail: "while the sandbox was being made", Err: errors.Join(context.Cause(ctx), err)}
		}
		var re *RunError
		if errors.As(err, &re) {
			return Result{}, err
		}
		return Result{}, &RunError{Reason: ReasonStart, Err: err}
	}
	// endsLater: the run returned early and the teardown owns the sandbox.
	endsLater := false
	defer func() {
		if !endsLater {
			sb.Release()
		}
	}()

	var killed *RunError
	if spec.OnStart != nil {
		if err := spec.OnStart(sb.Handle()); err != nil {
			killed = &RunError{Reason: ReasonUntracked, Detail: "cannot record the sandbox's handle, so a scheduler restart could not end it; the run was ended", Err: err}
		}
	}

	ended := make(chan waited, 1)
	waitCtx, stopWaiting := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if !endsLater {
			stopWaiting()
		}
	}()
	go func() {
		exit, err := sb.Wait(waitCtx)
		ended <- waited{exit, err}
	}()

	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		timer := time.NewTimer(spec.Timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	grace := spec.KillGrace
	if grace <= 0 {
		grace = DefaultKillGrace
	}
	// A sandbox that can end in the background is answered once the
	// agent's response and its log are both complete.
	var complete, logEnded <-chan struct{}
	ender, canEndLater := sb.(BackgroundEnder)
	if canEndLater {
		complete, logEnded = stdout.Complete(), stderr.Ended()
	}
	gotResponse, gotLog := false, false
	var end waited
	gotEnd := false
	for killed == nil && !gotEnd {
		select {
		case end = <-ended:
			gotEnd = true
		case <-timeout:
			killed = Errorf(ReasonTimeout, "killed after %s", spec.Timeout)
		case <-ctx.Done():
			killed = &RunError{Reason: ReasonCanceled, Err: context.Cause(ctx)}
		case <-complete:
			gotResponse, complete = true, nil
		case <-logEnded:
			gotLog, logEnded = true, nil
		}
		if canEndLater && gotResponse && gotLog && !gotEnd && killed == nil {
			canEndLater = false // looked at once; otherwise the run ends as below
			if res, ok := answered(spec, stdout, stderr); ok {
				endsLater = true
				ender.EndsInBackground(func() error { return endAfterAnswer(sb, ended, stopWaiting, grace) })
				return res, nil
			}
		}
	}

	// Kill in every case: after a normal end it ends what the agent's tools
	// left running, and it is what makes the output streams reach EOF.
	killCtx, cancelKill := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	killErr := sb.Kill(killCtx)
	cancelKill()
	if !gotEnd {
		select {
		case end = <-ended:
		case <-time.After(killTimeout):
			stopWaiting()
			end = <-ended
			if end.err == nil {
				end.err = errors.New("the sandbox did not end after it was killed")
			}
		}
	}
	select {
	case <-sb.Drained():
	case <-time.After(grace):
		sb.Release()
		<-sb.Drained()
	}

	res := Result{ExitCode: end.exit.Code, Stderr: stderr.String()}
	if end.err != nil && killed == nil {
		var re *RunError
		if errors.As(end.err, &re) {
			re.Detail = WithTail(re.Detail, res.Stderr)
			return res, re
		}
		return res, &RunError{Reason: ReasonCrashed, Detail: WithTail("lost track of the sandbox", res.Stderr), Err: end.err}
	}
	if killed != nil {
		if killErr != nil {
			killed.Detail = strings.TrimPrefix(killed.Detail+"; cannot kill the sandbox: "+killErr.Error(), "; ")
		}
		killed.Detail = WithTail(killed.Detail, res.Stderr)
		return res, killed
	}
	return interpret(spec, sb, end.exit, res, stdout)
}

// endAfterAnswer is what is left of a run that was answered before its
// sandbox ended: kill what is still running, wait for the exit and the
// output, and release the sandbox. It says what went wrong, including an
// OOM kill the engine reports only now.
func endAfterAnswer(sb Sandbox, ended <-chan waited, stopWaiting context.CancelFunc, grace time.Duration) error {
	defer sb.Release()
	defer stopWaiting()
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	if err := sb.Kill(ctx); err != nil {
		errs = append(errs, err)
	}
	var end waited
	select {
	case end = <-ended:
	case <-ctx.Done():
		errs = append(errs, errors.New("the sandbox did not end after it was killed"))
		return errors.Join(errs...)
	}
	if end.err != nil {
		errs = append(errs, end.err)
	}
	select {
	case <-sb.Drained():
	case <-time.After(grace):
	}
	if end.exit.OOM || sb.Inspect(ctx, false) {
		errs = append(errs, errors.New("the kernel OOM-killed a process of the sandbox after the agent had answered"))
	}
	return errors.Join(errs...)
}

// interpret maps how the agent ended to a Result or a RunError.
func interpret(spec Spec, sb Sandbox, exit Exit, res Result, stdout *Stdout) (Result, error) {
	switch {
	case exit.NeverRan != "":
		return res, Errorf(ReasonStart, "%s", WithTail(exit.NeverRan, res.Stderr))
	case exit.RuntimeLimit:
		return res, Errorf(ReasonTimeout, "%s", WithTail("the sandbox's runtime limit was reached", res.Stderr))
	}
	out, err := res, error(nil)
	if exit.Signal == 0 && exit.Code >= 0 {
		out, err = Interpret(res, stdout, spec.RunID)
	}
	// The agent's own count of OOM kills in its cgroup holds when the
	// engine's word comes late or never.
	oom := exit.OOM || out.Response.OOMKills > 0
	if !oom {
		ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		oom = sb.Inspect(ctx, sigkilled(exit, out))
		cancel()
	}
	if oom {
		return res, Errorf(ReasonOutOfMemory, "%s", WithTail(fmt.Sprintf("the sandbox hit its memory limit of %s (container_mode.memory_limit)", FormatBytes(spec.Limits.MemoryBytes)), res.Stderr))
	}
	if exit.Signal != 0 || exit.Code < 0 {
		detail := "agent was killed"
		if exit.Signal != 0 {
			detail = "agent was killed by signal " + exit.Signal.String()
		}
		return res, Errorf(ReasonCrashed, "%s", WithTail(detail, res.Stderr))
	}
	return out, err
}

// sigkilled reports whether the agent or one of its tools ended by SIGKILL,
// the way the OOM killer ends a process.
func sigkilled(exit Exit, res Result) bool {
	if exit.Signal == syscall.SIGKILL || exit.Code == 128+9 {
		return true
	}
	for _, tc := range res.Response.ToolCalls {
		if strings.Contains(tc.Output, `"exit_code":137`) {
			return true
		}
	}
	return false
}

// FormatBytes writes a byte count the way memory_limit is written (512m).
func FormatBytes(n int64) string {
	switch {
	case n <= 0:
		return "none"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dg", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dm", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dk", n>>10)
	}
	return fmt.Sprintf("%db", n)
}

// KnownSecrets are the secrets of spec that Supervise redacts from what a
// run returns; the scheduler redacts them from the text files a reply
// carries too.
func KnownSecrets(spec Spec) []string { return knownSecrets(spec) }
