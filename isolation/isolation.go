// Package isolation runs one berth-agent request in a sandbox and returns its
// response. Backend is the only thing the scheduler knows about sandboxes: it
// hands over a Spec (a Plan and the request) and gets a Result or an error
// whose Reason a user can read.
//
// What a sandbox is made of is decided before the run, in a Plan
// (internal/runplan compiles it); backends read it and never change it. How
// a run is timed out, canceled, killed, drained and given its reason is
// decided once, in Supervise; a backend only starts, waits for, kills and
// inspects its sandbox.
//
// Backends live in subpackages: landlock (a confined host process) and
// unrestricted (a plain host process, only when an admin configured it) and
// container (a fresh Docker container per run, through the Engine API).
//
// A Keeper (keeper.go) keeps a sandbox between requests instead: one
// confined berth-agent in serve mode takes one request at a time and keeps
// its /tmp and background processes until it is stopped (ADR 21).
package isolation

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Result is a finished run: the agent wrote a response (which may itself carry
// an agent-level error such as "max iterations reached").
type Result struct {
	Response agentproto.Response
	ExitCode int
	// Stderr is the tail of the agent's stderr (its logs), kept in the run record.
	Stderr string
	// Egress are the decisions of the run's egress proxy the record keeps,
	// oldest first: the first and last ones and the refusals (see
	// EgressFirstKept); EgressDropped counts those left out, EgressCounts
	// counts them all.
	Egress        []EgressDecision
	EgressDropped int
	EgressCounts  EgressCounts
	// Usage is what the run's provider calls spent, as its egress proxy
	// read it from each answer (docs/adr/0024-usage-and-budgets.md).
	Usage egresspolicy.Usage
	// ReplyFiles are the reply's files a backend read from a sandbox whose
	// workspace is not on the scheduler's host (Spec.Files.Out).
	ReplyFiles []SandboxFile
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
	// ReasonOutOfMemory: the kernel's OOM killer ended a process of the
	// run's cgroup or container.
	ReasonOutOfMemory = "out of memory"
	// ReasonUntracked: the sandbox's handle could not be recorded, so a
	// scheduler crash would leave it unkillable; the run was ended instead.
	ReasonUntracked = "sandbox could not be tracked"
	// ReasonEngineUnavailable and ReasonImageUnavailable: the container
	// backend could not reach its engine, or make or find the run's image.
	ReasonEngineUnavailable = "container engine unavailable"
	ReasonImageUnavailable  = "container image unavailable"
	// ReasonClusterUnavailable: the kubernetes backend could not reach the
	// cluster's API server within its deadline.
	ReasonClusterUnavailable = "kubernetes API unavailable"
	// ReasonImageBuildFailed: berth-imaged could not build (or be reached
	// for) a container run's image; the detail names the failing step.
	ReasonImageBuildFailed = "image build failed"
)

// Reasons a run is refused before a backend starts it, or ended by the
// scheduler rather than its sandbox.
const (
	// ReasonProviderNeedsNetwork: the agent's model is reached over the
	// network while the agent has none and no egress proxy can serve it
	// (docs/adr/0011-egress-gateway.md).
	ReasonProviderNeedsNetwork = "provider needs network"
	// ReasonAgentNotConfigured: the run's agent is not in the config.
	ReasonAgentNotConfigured   = "agent is not configured"
	ReasonUndeliverable        = "reply cannot be delivered"
	ReasonContainerUnavailable = "container isolation is not available in this build"
	ReasonInterruptedTwice     = "interrupted twice by scheduler restarts"
	ReasonNoBackend            = "isolation backend is not available"
	ReasonInternal             = "internal error"
)

// Explainer is a backend that can say how it confines a plan on this host:
// which limits hold and which do not. `berthctl sandbox explain` shows it.
type Explainer interface {
	Explain(p Plan) Confinement
}

// Confinement is how a plan is confined on this machine.
type Confinement struct {
	// Mode is "transient unit", "process" or "container".
	Mode    string   `json:"mode"`
	Holds   []string `json:"holds,omitempty"`
	Missing []string `json:"missing,omitempty"`
}

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
