package isolation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
)

// A kept sandbox outlives one request (docs/adr/0021-conversation-sandboxes.md):
// berth-agent runs in serve mode (agent.ServeArg), confines itself once at
// the opening and then takes one request at a time as a line of JSON on its
// stdin, answering each with one line on stdout. Its /tmp, and what its
// tools started in the background, stay until it is stopped. The backend
// only starts, signals, kills and measures it (KeptBody, OpenKept); how requests
// travel, time out and are answered is decided here, for every backend.

// Keeper is a backend that can keep a sandbox alive between requests.
type Keeper interface {
	// Start opens a sandbox for spec's plan and returns once berth-agent in
	// it is confined and ready for its first request. spec.RunID is the
	// sandbox's id (it names what the sandbox leaves on the host, as a run
	// id does); spec.Request is not run, only its confinement counts.
	// spec.OnStart gets the handle Backend.Kill understands before the
	// agent reads anything; an error from it stops the sandbox.
	Start(ctx context.Context, spec Spec) (Kept, error)
}

// Kept is one live kept sandbox.
type Kept interface {
	// Handle is what Backend.Kill understands: it ends the sandbox and all
	// it leaves on the host when its owner is gone.
	Handle() string
	// Run runs one request in the sandbox and waits for its response; runs
	// are taken one at a time, in the order they call. Its policy,
	// workspace, providers and egress are the sandbox's (as Spec.Input
	// makes them). A run that times out or is canceled stops the sandbox
	// (the agent cannot be trusted to be idle after it) and fails with
	// ReasonTimeout or ReasonCanceled; Done is then closed.
	Run(ctx context.Context, req agentproto.Request) (Result, error)
	// LastActivity is when the sandbox was last active: the end of its last
	// run, the latest Touch, or now while a run is under way.
	LastActivity() time.Time
	// Touch records activity the sandbox's owner saw elsewhere: an egress
	// request of the sandbox (its proxy's decisions), a tool's call out.
	Touch(at time.Time)
	// Runs is how many requests the sandbox has run.
	Runs() int
	// Done is closed once the sandbox's agent has ended, by Stop or by
	// itself (a crash, an OOM kill): it takes no more requests.
	Done() <-chan struct{}
	// Stop ends the sandbox: SIGTERM to it, up to grace for everything in
	// it to end, then SIGKILL; what it left on the host is removed. Stopping
	// a stopped sandbox returns the first Stop's result.
	Stop(ctx context.Context, grace time.Duration) error
	// Memory is what the sandbox uses now, in bytes (its cgroup's or
	// container's memory: every process of it, page cache of its /tmp
	// included).
	Memory(ctx context.Context) (int64, error)
}

// KeptBody is a kept sandbox as its backend runs it.
type KeptBody interface {
	// Handle is what Backend.Kill understands.
	Handle() string
	// Terminate sends SIGTERM to every process of the sandbox, or to its
	// agent when the agent passes it on itself.
	Terminate(ctx context.Context) error
	// WaitEnded returns once no process of the sandbox is left, or ctx's error.
	WaitEnded(ctx context.Context) error
	// Kill SIGKILLs every process of the sandbox; gone is not an error.
	Kill(ctx context.Context) error
	// Exited is closed once the agent's process has ended; ExitStatus then
	// says how.
	Exited() <-chan struct{}
	ExitStatus() Exit
	// OOMKilled tells whether the kernel OOM-killed a process of the sandbox.
	OOMKilled(ctx context.Context) bool
	Memory(ctx context.Context) (int64, error)
	// Release removes what is left (cgroup, container) once it is killed.
	Release()
}

// KeptOutput takes a kept agent's stdout (one response per line) and
// stderr (its log, kept per request) as the backend copies them.
type KeptOutput struct {
	lines  chan keptLine
	closed chan struct{}
	once   sync.Once

	mu      sync.Mutex
	partial []byte
	over    bool
	tail    *Tail // the current request's log
	// progress reads the current request's log for progress (ADR 27).
	progress *progressLines
}

// keptLine is one line of a kept agent's stdout; err when it was too long.
type keptLine struct {
	data []byte
	err  error
}

// NewKeptOutput returns the streams a backend copies a kept agent's
// output into.
func NewKeptOutput() *KeptOutput {
	return &KeptOutput{lines: make(chan keptLine, 4), closed: make(chan struct{}), tail: NewTail()}
}

// Stdout is where the backend writes the agent's stdout.
func (o *KeptOutput) Stdout() io.Writer { return keptStdout{o} }

// Stderr is where the backend writes the agent's stderr.
func (o *KeptOutput) Stderr() io.Writer { return keptStderr{o} }

type keptStdout struct{ o *KeptOutput }

func (w keptStdout) Write(p []byte) (int, error) {
	o := w.o
	o.mu.Lock()
	var ready []keptLine
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if !o.over {
			if len(o.partial)+len(chunk) > MaxResponse {
				o.over, o.partial = true, nil
			} else {
				o.partial = append(o.partial, chunk...)
			}
		}
		if i < 0 {
			break
		}
		line := keptLine{data: o.partial}
		if o.over {
			line = keptLine{err: fmt.Errorf("response is larger than %d bytes", MaxResponse)}
		}
		ready = append(ready, line)
		o.partial, o.over = nil, false
		rest = rest[i+1:]
	}
	o.mu.Unlock()
	for _, l := range ready {
		select {
		case o.lines <- l:
		case <-o.closed:
			return len(p), nil
		}
	}
	return len(p), nil
}

type keptStderr struct{ o *KeptOutput }

func (w keptStderr) Write(p []byte) (int, error) {
	w.o.mu.Lock()
	t, progress := w.o.tail, w.o.progress
	w.o.mu.Unlock()
	if progress != nil {
		_, _ = progress.Write(p)
	}
	return t.Write(p)
}

// newRequestTail starts a fresh log tail for the next request.
func (o *KeptOutput) newRequestTail() *Tail {
	t := NewTail()
	o.mu.Lock()
	o.tail = t
	o.mu.Unlock()
	return t
}

func (o *KeptOutput) currentTail() *Tail {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tail
}

// close lets a copier blocked on a line nobody reads any more go on.
func (o *KeptOutput) close() { o.once.Do(func() { close(o.closed) }) }

// DefaultOpenTimeout bounds a sandbox's opening when its plan has no timeout.
const DefaultOpenTimeout = time.Minute

// logSettle bounds how long a run's answer waits for the agent's log to
// reach its ResponseFollows line (stdout and stderr travel apart).
const logSettle = 100 * time.Millisecond

// OpenKept hands a started kept agent its opening request on stdin and waits
// until it is confined and ready: the backend's half of Keeper.Start after
// it started body with out as its output. On failure the sandbox is killed
// and released, and the error is a *RunError (ReasonConfinement when the
// agent refused to confine itself).
func OpenKept(ctx context.Context, spec Spec, body KeptBody, stdin io.WriteCloser, out *KeptOutput) (Kept, error) {
	k := &kept{spec: spec, body: body, stdin: stdin, out: out, last: time.Now(), stopped: make(chan struct{})}
	fail := func(err error) (Kept, error) {
		k.kill()
		return nil, err
	}
	if spec.OnStart != nil {
		if err := spec.OnStart(body.Handle()); err != nil {
			return fail(&RunError{Reason: ReasonUntracked, Detail: "cannot record the sandbox's handle, so a scheduler restart could not end it; the sandbox was stopped", Err: err})
		}
	}
	if spec.Request.Version == 0 {
		spec.Request.Version = agentproto.Version
	}
	input, err := spec.Input()
	if err != nil {
		return fail(err)
	}
	if err := k.send(ctx, input); err != nil {
		return fail(err)
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = DefaultOpenTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line := <-out.lines:
		resp, err := parseLine(line, spec.RunID)
		if err == nil && (resp.Reply != "" || resp.Error != "") {
			err = errors.New("the opening answer carries a reply")
		}
		if err != nil {
			return fail(&RunError{Reason: ReasonBadResponse, Detail: WithTail("the sandbox's opening", out.currentTail().String()), Err: err})
		}
		return k, nil
	case <-body.Exited():
		exit := body.ExitStatus()
		<-time.After(logSettle)
		stderr := out.currentTail().String()
		if exit.Code == agentproto.ExitConfinement {
			return fail(Errorf(ReasonConfinement, "%s", WithTail("the sandbox's agent refused to confine itself (exit code 3)", stderr)))
		}
		return fail(Errorf(ReasonStart, "%s", WithTail(fmt.Sprintf("the sandbox's agent ended before it was ready (exit code %d)", exit.Code), stderr)))
	case <-timer.C:
		return fail(Errorf(ReasonTimeout, "the sandbox was not ready within %s", timeout))
	case <-ctx.Done():
		return fail(&RunError{Reason: ReasonCanceled, Detail: "while the sandbox was being opened", Err: context.Cause(ctx)})
	}
}

// kept is a Kept over a backend's KeptBody.
type kept struct {
	spec  Spec
	body  KeptBody
	stdin io.WriteCloser
	out   *KeptOutput

	runMu sync.Mutex // one request at a time

	mu   sync.Mutex
	last time.Time
	busy bool
	runs int

	stopOnce sync.Once
	stopErr  error
	stopped  chan struct{}
}

func (k *kept) Handle() string        { return k.body.Handle() }
func (k *kept) Done() <-chan struct{} { return k.body.Exited() }

func (k *kept) LastActivity() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.busy {
		return time.Now()
	}
	return k.last
}

func (k *kept) Touch(at time.Time) {
	k.mu.Lock()
	if at.After(k.last) {
		k.last = at
	}
	k.mu.Unlock()
}

func (k *kept) Runs() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.runs
}

func (k *kept) Memory(ctx context.Context) (int64, error) { return k.body.Memory(ctx) }

// maxServedRequest is berth-agent's MaxRequestSize, the longest request
// line it reads.
const maxServedRequest = 16 << 20

// send writes one request line; a large request is written while the
// agent reads it, and an agent that ends meanwhile fails it.
func (k *kept) send(ctx context.Context, input []byte) error {
	line := append(input[:len(input):len(input)], '\n')
	written := make(chan error, 1)
	go func() {
		_, err := k.stdin.Write(line)
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			return &RunError{Reason: ReasonCrashed, Detail: "cannot hand the request to the sandbox", Err: err}
		}
		return nil
	case <-k.body.Exited():
		return Errorf(ReasonCrashed, "the sandbox ended before it took the request")
	case <-ctx.Done():
		return &RunError{Reason: ReasonCanceled, Err: context.Cause(ctx)}
	}
}

func (k *kept) Run(ctx context.Context, req agentproto.Request) (Result, error) {
	k.runMu.Lock()
	defer k.runMu.Unlock()
	select {
	case <-k.body.Exited():
		return Result{}, Errorf(ReasonCrashed, "the sandbox has ended; a fresh one is needed")
	default:
	}
	if req.RunID == "" {
		return Result{}, Errorf(ReasonStart, "the request has no run id")
	}
	spec := k.spec
	// The opening request's rlimits are the sandbox's; a run cannot change them.
	req.Rlimits = k.spec.Request.Rlimits
	if req.Provider == (agentproto.Provider{}) {
		req.Provider, req.Fallback = k.spec.Request.Provider, k.spec.Request.Fallback
	}
	if req.Version == 0 {
		req.Version = agentproto.Version
	}
	spec.RunID, spec.Request = req.RunID, req
	input, err := spec.Input()
	if err != nil {
		return Result{}, err
	}
	if len(input) > maxServedRequest {
		// The agent would end at the line, taking the conversation's
		// sandbox down for a request it never ran: refuse it unsent.
		return Result{}, Errorf(ReasonStart, "the request is %d MiB, more than the %d MiB berth-agent reads; it was not sent and the sandbox is kept", (len(input)+1<<20-1)>>20, maxServedRequest>>20)
	}
	k.mu.Lock()
	k.busy = true
	k.runs++
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.busy, k.last = false, time.Now()
		k.mu.Unlock()
	}()
	tail := k.out.newRequestTail()
	k.out.setProgress(newProgressLines(ctx, spec))
	defer k.out.setProgress(nil)
	res, err := k.run(ctx, spec, input, tail)
	return redact(spec, res, err)
}

func (k *kept) run(ctx context.Context, spec Spec, input []byte, tail *Tail) (Result, error) {
	if err := k.send(ctx, input); err != nil {
		k.afterFailure()
		return Result{Stderr: tail.String()}, err
	}
	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		timer := time.NewTimer(spec.Timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case line := <-k.out.lines:
		select {
		case <-tail.Ended():
		case <-time.After(logSettle):
		}
		res := Result{Stderr: tail.String()}
		resp, err := parseLine(line, spec.RunID)
		if err != nil {
			k.afterFailure()
			return res, &RunError{Reason: ReasonBadResponse, Detail: WithTail("the sandbox's answer; the sandbox was stopped", res.Stderr), Err: err}
		}
		res.Response = resp
		if resp.OOMKills > 0 {
			// The agent lives on; only a tool of this run was OOM-killed.
			return res, Errorf(ReasonOutOfMemory, "%s", WithTail(fmt.Sprintf("the sandbox hit its memory limit of %s", FormatBytes(spec.Limits.MemoryBytes)), res.Stderr))
		}
		if resp.Error != "" {
			res.ExitCode = agentproto.ExitAgentError
		}
		return res, nil
	case <-k.body.Exited():
		<-time.After(logSettle)
		exit := k.body.ExitStatus()
		stderr := tail.String()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		oom := exit.OOM || k.body.OOMKilled(ctx)
		cancel()
		k.afterFailure()
		res := Result{ExitCode: exit.Code, Stderr: stderr}
		if oom {
			return res, Errorf(ReasonOutOfMemory, "%s", WithTail(fmt.Sprintf("the sandbox hit its memory limit of %s", FormatBytes(spec.Limits.MemoryBytes)), stderr))
		}
		detail := fmt.Sprintf("the sandbox's agent ended during the run (exit code %d)", exit.Code)
		if exit.Signal != 0 {
			detail = "the sandbox's agent was killed by signal " + exit.Signal.String()
		}
		return res, Errorf(ReasonCrashed, "%s", WithTail(detail, stderr))
	case <-timeout:
		k.afterFailure()
		return Result{Stderr: tail.String()}, Errorf(ReasonTimeout, "%s", WithTail(fmt.Sprintf("killed after %s; the sandbox was stopped", spec.Timeout), tail.String()))
	case <-ctx.Done():
		k.afterFailure()
		return Result{Stderr: tail.String()}, &RunError{Reason: ReasonCanceled, Detail: WithTail("the sandbox was stopped", tail.String()), Err: context.Cause(ctx)}
	}
}

// afterFailure stops a sandbox whose run failed: what it is doing now is
// unknown, so it takes no further request.
func (k *kept) afterFailure() { k.kill() }

// kill stops the sandbox without a grace.
func (k *kept) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	_ = k.Stop(ctx, 0)
}

func (k *kept) Stop(ctx context.Context, grace time.Duration) error {
	k.stopOnce.Do(func() {
		var errs []error
		if grace > 0 {
			if err := k.body.Terminate(ctx); err != nil {
				errs = append(errs, err)
			}
			graceCtx, cancel := context.WithTimeout(ctx, grace)
			err := k.body.WaitEnded(graceCtx)
			cancel()
			if err == nil {
				k.finish()
				k.stopErr = errors.Join(errs...)
				return
			}
		}
		killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		defer cancel()
		if err := k.body.Kill(killCtx); err != nil {
			errs = append(errs, err)
		}
		if err := k.body.WaitEnded(killCtx); err != nil {
			errs = append(errs, fmt.Errorf("cannot see the sandbox end after it was killed: %w", err))
		}
		k.finish()
		k.stopErr = errors.Join(errs...)
	})
	return k.stopErr
}

// finish closes the agent's stdin and releases what the backend holds.
func (k *kept) finish() {
	_ = k.stdin.Close()
	k.out.close()
	k.body.Release()
	close(k.stopped)
}

// parseLine decodes one answer of a kept agent for run runID.
func parseLine(line keptLine, runID string) (agentproto.Response, error) {
	if line.err != nil {
		return agentproto.Response{}, line.err
	}
	var resp agentproto.Response
	if err := json.Unmarshal(line.data, &resp); err != nil {
		return agentproto.Response{}, fmt.Errorf("cannot decode response: %w", err)
	}
	if resp.Version != agentproto.Version {
		return agentproto.Response{}, fmt.Errorf("response has version %d, want %d", resp.Version, agentproto.Version)
	}
	if resp.RunID != runID {
		return agentproto.Response{}, fmt.Errorf("response is for run %q, want %q", resp.RunID, runID)
	}
	return resp, nil
}
