// Package isolation runs one berth-agent request in a sandbox and returns its
// response. Backend is the only thing the scheduler knows about sandboxes: it
// hands over a Spec and gets a Result or an error whose Reason a user can read.
//
// Backends live in subpackages: landlock (a confined host process) and
// unrestricted (a plain host process, only when an admin configured it) and
// container (a fresh Docker container per run, through the Engine API).
package isolation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

// Spec is everything a backend needs to run one request.
type Spec struct {
	RunID   string
	AgentID string
	// Request is written to the agent's stdin. It carries the provider key:
	// backends must never put any of it in argv, environment, labels or files.
	Request agentproto.Request
	// Workspace is the host path of the agent's workspace; it exists.
	Workspace string
	// AgentBinary is the host path of berth-agent.
	AgentBinary string
	// RunAs is the unprivileged user the agent runs as. Backends refuse "root"
	// (and uid 0) unless they are the unrestricted backend.
	RunAs string
	// Timeout ends the run (the process is killed) with ReasonTimeout.
	Timeout time.Duration
	// Container is the agent's container_mode; only the container backend
	// reads it.
	Container config.Container
	// OnStart is called once the sandbox exists, with a handle Kill understands.
	// The scheduler persists the handle so a restarted scheduler can kill
	// orphans. May be nil.
	OnStart func(handle string)
}

// Result is a finished run: the agent wrote a response (which may itself carry
// an agent-level error such as "max iterations reached").
type Result struct {
	Response agentproto.Response
	ExitCode int
	// Stderr is the tail of the agent's stderr (its logs), kept in the run record.
	Stderr string
}

// Backend runs agent requests in one kind of sandbox.
type Backend interface {
	// Name is the backend's config name: "landlock", "unrestricted", "container".
	Name() string
	// Run runs the request and waits for it. A run that produced no valid
	// response returns a *RunError.
	Run(ctx context.Context, spec Spec) (Result, error)
	// Kill ends a sandbox left behind by an earlier scheduler process, given the
	// handle OnStart reported. Killing something already gone is not an error.
	Kill(ctx context.Context, handle string) error
}

// Reasons a run fails; they are stored with the run and shown to users.
const (
	ReasonTimeout     = "timeout"
	ReasonCanceled    = "canceled"
	ReasonConfinement = "confinement failed"
	ReasonCrashed     = "agent crashed"
	ReasonStart       = "cannot start agent"
	ReasonBadResponse = "bad response"
)

// RunError is a run that ended without a usable response.
type RunError struct {
	Reason string // one of the Reason constants
	Detail string // what happened, for humans: stderr tail, exit code, ...
	Err    error
}

func (e *RunError) Error() string {
	msg := e.Reason
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *RunError) Unwrap() error { return e.Err }

// ReasonOf returns the Reason of a *RunError in err's chain, or "" if there is none.
func ReasonOf(err error) string {
	var re *RunError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// Errorf builds a *RunError.
func Errorf(reason, format string, args ...any) *RunError {
	return &RunError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}
