package runprep

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// Options are the preparation's side effects and seams.
type Options struct {
	// StateDir is the scheduler's state directory: workspaces, egress
	// sockets and workspace images live under it.
	StateDir string
	// Backends maps a plan's backend kind ("landlock", "unrestricted",
	// "container") to the backend that runs it.
	Backends map[string]isolation.Backend
	// ForceUnrestricted compiles every landlock agent's plan for the
	// "unrestricted" backend, saying why (berth-scheduler --unrestricted).
	ForceUnrestricted bool
	// ConfigDir is protected from agents; "" means the directories of the
	// loaded config files.
	ConfigDir string
	// Getenv reads provider keys and SSL_CERT_FILE; nil means os.Getenv.
	Getenv func(string) string
	// Images gives container plans that name no image their isolation image.
	// Nil: the container backend builds its default image itself.
	Images ImageEnsurer
	// UIDs keeps the agents' own uids (scheduler.db's agent_uids/ bucket).
	// Required when the scheduler runs as root with per-agent uids.
	UIDs UIDStore
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// QuotaRefusal, when set, is why this host cannot enforce workspace
	// quotas: for tests, which can make quotas fail no other way.
	QuotaRefusal error
}

// UIDStore is the bbolt file the agents' uids are kept in; *bolt.DB is one.
type UIDStore interface {
	View(fn func(*bolt.Tx) error) error
	Update(fn func(*bolt.Tx) error) error
}

// Preparer readies runs; one serves every run of a scheduler, concurrently.
type Preparer struct {
	opts Options
	log  *slog.Logger
	// workspacesSweptFor is the config the workspace images were last swept
	// for (sweepWorkspacesOnce).
	workspacesSweptFor atomic.Pointer[config.Config]
	// users looks up [scheduler] egress_user and run_as (runusers.go).
	users *userCache

	// routers are berth's egress routers for kubernetes pods, by
	// [kubernetes] proxy_listen (kuberouter.go).
	routersMu sync.Mutex
	routers   map[string]*kubeRouter
}

// New returns a Preparer with opts.
func New(opts Options) *Preparer {
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Preparer{opts: opts, log: opts.Logger, users: runUsers}
}

// Input names the run to prepare.
type Input struct {
	// Config is the configuration the run started with.
	Config *config.Config
	// Agent is the agent's id.
	Agent string
	// RunID and Attempt name the run and its start number: the plan and its
	// egress directory carry both, so a dead attempt's leftovers are told
	// from the live one's.
	RunID   string
	Attempt int
	// Overrides are the run's own model and timeout (a scheduled job's).
	Overrides runplan.Overrides
	// Spending is what the run's egress proxy may spend and whom it tells.
	Spending Spending
	// Traceparent is the W3C trace context of the run's span, which the
	// egress proxy sends on provider calls when [tracing]
	// provider_traceparent is on ("": none).
	Traceparent string
	// OnAsk is told each request the run's egress proxy holds for a
	// person's answer ([agents.egress] ask), which Prepared.Answer gives;
	// it must not block. Nil: such requests are refused at once.
	OnAsk func(egresspolicy.Ask)
	// OnAskSettled, when set, is told how each ask ended (By "timeout":
	// nobody answered in time; "": the tool hung up or the run ended
	// first). It must not block.
	OnAskSettled func(egresspolicy.Answer)
}

// Spending is the budget side of a run's egress proxy
// (docs/adr/0024-usage-and-budgets.md): the allowance it starts with (nil:
// no budget) and who is told each provider call (it must not block).
type Spending struct {
	Allowance *egresspolicy.Allowance
	OnCall    func(egresspolicy.Call)
}

// Prepared is a run ready for its backend: call Finish once Backend.Run
// has returned.
type Prepared struct {
	// Agent is the run's agent as configured.
	Agent config.Agent
	// Plan is the run's compiled plan, its image filled in.
	Plan isolation.Plan
	// Backend runs Plan.
	Backend isolation.Backend

	proxy       *egress.Proxy
	egressToken string
	// agentToken opens berth-agent's own channel at the proxy (ADR 26).
	agentToken string
	// unroute takes a kubernetes run off berth's egress router.
	unroute func()
	// allowances is proxy while it runs, for SetAllowance from another
	// goroutine than the run's.
	allowances atomic.Pointer[egress.Proxy]
}

// Spec is what Backend.Run takes for req: the plan, the request and the
// token of the run's egress proxy. onStart may be nil.
func (p *Prepared) Spec(req agentproto.Request, onStart func(handle string) error) isolation.Spec {
	return isolation.Spec{Plan: p.Plan, Request: req, EgressToken: p.egressToken, EgressAgentToken: p.agentToken, OnStart: onStart}
}

// SetAllowance hands the run's egress proxy a newer allowance; a run
// without a proxy has nothing to limit.
func (p *Prepared) SetAllowance(a egresspolicy.Allowance) error {
	if p == nil {
		return nil
	}
	if proxy := p.allowances.Load(); proxy != nil {
		return proxy.SetAllowance(a)
	}
	return nil
}

// Answer hands the run's egress proxy a person's answer to one of its
// asks (Input.OnAsk).
func (p *Prepared) Answer(a egresspolicy.Answer) error {
	if p != nil {
		if proxy := p.allowances.Load(); proxy != nil {
			return proxy.Answer(a)
		}
	}
	return fmt.Errorf("cannot answer ask %q: the run has no egress proxy (it has ended, or has no egress)", a.ID)
}

// Finish stops the run's egress proxy, if it has one (its token dies with
// it), and returns what the proxy decided. Safe to call more than once.
func (p *Prepared) Finish() egress.Record {
	if p != nil && p.unroute != nil {
		p.unroute()
		p.unroute = nil
	}
	if p == nil || p.proxy == nil {
		return egress.Record{}
	}
	proxy := p.proxy
	p.proxy = nil
	p.allowances.Store(nil)
	return proxy.Stop()
}

// Prepare readies one run of in.Agent: compiles its plan, finds its
// backend, readies its user, workspace and image and starts its egress
// proxy. The error is a *isolation.RunError whose reason fails the run.
// When the backend is known the Prepared is returned even with an error,
// so the run's record says where it would have run; nothing of it then
// needs finishing.
func (p *Preparer) Prepare(ctx context.Context, in Input) (*Prepared, error) {
	return p.prepare(ctx, in, nil)
}

// prepare is Prepare; keep, when set, readies a kept sandbox (kept.go).
func (p *Preparer) prepare(ctx context.Context, in Input, keep *keepOptions) (*Prepared, error) {
	a, err := in.Config.Agent(in.Agent)
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonAgentNotConfigured, Err: err}
	}
	host := p.Facts(in.Config, a.ID)
	// Compile alone chooses the backend; a refused plan still names it, and
	// a missing backend is said before the plan's own problems.
	plan, compileErr := runplan.CompileWith(in.Config, a.ID, in.RunID, in.Attempt, in.Overrides, host)
	b, err := p.backendFor(plan.Backend)
	if err != nil {
		if plan.Backend == "" {
			err = compileErr
		}
		return nil, err
	}
	out := &Prepared{Agent: a, Plan: plan, Backend: b}
	if host.RunUserErr != nil {
		return out, &isolation.RunError{Reason: isolation.ReasonStart, Err: host.RunUserErr}
	}
	if err := p.readyWorkspace(ctx, in.Config, a, host.RunUser); err != nil {
		return out, err
	}
	if err := compileErr; err != nil {
		if isolation.ReasonOf(err) == "" {
			err = &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
		}
		return out, err
	}
	if err := p.isolationImage(ctx, &out.Plan); err != nil {
		return out, err
	}
	if out.Plan.Network.Allowed {
		p.log.Warn("run has a direct, unfiltered network (an admin's opt-in); its provider keys travel on stdin",
			"run_id", in.RunID, "agent", a.ID, "backend", b.Name(), "network", out.Plan.Network.Mode)
	}
	if out.Plan.Egress != nil {
		// The run's trace context goes to its provider calls only where the
		// admin asked: it is no secret, but it tells the provider berth's
		// trace ids.
		traceparent := ""
		if in.Config.Tracing.ProviderTraceparent {
			traceparent = in.Traceparent
		}
		out.proxy, out.egressToken, err = p.startEgress(ctx, out.Plan, host, keep, in, traceparent)
		if err != nil {
			return out, err
		}
		out.agentToken = out.proxy.AgentToken()
		// A pod reaches its run's proxy through the router (ADR 22).
		if out.unroute, err = p.routeKube(out.Plan, out.egressToken, out.agentToken); err != nil {
			out.Finish()
			return out, err
		}
		out.allowances.Store(out.proxy)
	}
	return out, nil
}

// backendFor is the backend a compiled plan runs on, or why this scheduler
// has none.
func (p *Preparer) backendFor(kind isolation.BackendKind) (isolation.Backend, error) {
	if b := p.opts.Backends[string(kind)]; b != nil {
		return b, nil
	}
	if kind == isolation.BackendContainer {
		return nil, &isolation.RunError{Reason: isolation.ReasonContainerUnavailable}
	}
	return nil, isolation.Errorf(isolation.ReasonNoBackend, "no backend %q in this scheduler", kind)
}
