package runprep

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/services/egress"
)

// startEgress starts the run's egress proxy as [scheduler] egress_user on
// the run's socket, holding the provider keys the request no longer carries.
func (p *Preparer) startEgress(ctx context.Context, plan isolation.Plan, host runplan.HostFacts, keep *keepOptions, in Input, traceparent string) (*egress.Proxy, string, error) {
	spend := in.Spending
	token, err := egress.NewToken()
	if err != nil {
		return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	pol := egress.Policy{RunID: plan.RunID, Agent: plan.AgentID, Token: token, Allow: plan.Egress.Allow,
		Ask: plan.Egress.Ask, ApprovalTimeout: plan.Egress.ApprovalTimeout, ToolAsk: plan.Egress.ToolAsk}
	// berth-agent's own channel (ADR 26): the proxy's AgentToken.
	if pol.AgentToken, err = egress.NewToken(); err != nil {
		return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
	}
	for _, ep := range plan.Egress.Providers {
		for _, pr := range plan.Providers {
			if pr.Name == ep.Name {
				ep.Key = pr.Key
				pol.Providers = append(pol.Providers, ep)
			}
		}
	}
	withGit(&pol, plan.Egress)
	pol.ReadOnly, pol.Allowance = plan.Egress.ReadOnly, spend.Allowance
	pol.Traceparent = traceparent
	var bundle []byte
	if hosts := caHosts(plan.Egress); len(hosts) > 0 {
		// A CA for this run only, for the hosts it intercepts only, for as
		// long as the run may last: its key lives in the proxy while the run lasts.
		lifetime := plan.Timeout + plan.KillGrace
		if keep != nil {
			// A kept sandbox's proxy, and its CA, serve it for its whole life.
			lifetime = keep.lifetime + plan.Timeout + plan.KillGrace
		}
		ca, err := egress.NewCA(plan.RunID, hosts, egress.CALifetime(lifetime))
		if err != nil {
			return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Err: err}
		}
		pol.CA, bundle = &ca, ca.Bundle()
		pol.Secrets = slices.Clone(plan.Egress.Secrets)
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var onDecision func(isolation.EgressDecision)
	if keep != nil {
		onDecision = keep.onEgress
	}
	proxy, err := egress.Launch(startCtx, pol, egress.LaunchOptions{
		OnDecision: onDecision,
		OnCall:     spend.OnCall,
		OnAsk:      in.OnAsk,
		// How an ask ended closes its pending approval.
		OnAskSettled: in.OnAskSettled,
		Binary:       plan.Egress.Proxy.Binary,
		User:         host.EgressUser,
		Client:       host.RunUser,
		Socket:       plan.Egress.Socket,
		Logger:       p.log,
		CABundle:     bundle,
		// Private CAs the admin gave the scheduler hold for upstreams too.
		UpstreamCAFile: p.opts.Getenv("SSL_CERT_FILE"),
		Confine:        p.confineEgress(ctx, plan),
		MemoryMax:      int64(egressProxyLimits.MemoryMax),
	})
	if err != nil {
		return nil, "", &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start the run's egress proxy", Err: err}
	}
	return proxy, token, nil
}

// egressProxyLimits bound each run's berth-egress: a run that exhausts its
// proxy (bodies, connections, threads) starves only its own.
var egressProxyLimits = hostrun.Limits{MemoryMax: 128 << 20, TasksMax: 128, CPUQuotaPercent: 100}

// confineEgress puts a run's proxy into a scope or cgroup of its own. Where
// neither can be made the run fails, unless [scheduler]
// allow_rlimit_fallback accepts a proxy without limits, as it accepts host
// runs without cgroups.
func (p *Preparer) confineEgress(ctx context.Context, plan isolation.Plan) func(pid int) (func(), error) {
	return func(pid int) (func(), error) {
		h, err := hostrun.ConfineHelper(ctx, "egress", isolation.AttemptName(plan.RunID, plan.Attempt), pid, egressProxyLimits, hostrun.SystemdAvailable())
		if err != nil {
			if plan.Limits.RlimitFallback {
				p.log.Warn("the run's egress proxy runs without limits of its own (allow_rlimit_fallback)", "run_id", plan.RunID, "err", err)
				return func() {}, nil
			}
			return nil, err
		}
		return h.Release, nil
	}
}
