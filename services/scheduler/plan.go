package scheduler

import (
	"context"
	"fmt"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/runprep"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/isolation"
)

// runOnce has the run prepared (internal/runprep: plan, backend, user,
// workspace, image, egress proxy), hands it to its backend and finishes it.
// backend is the name of the backend used, if any.
func (s *Service) runOnce(ctx context.Context, r Run, cfg *config.Config) (res runOutcome, backend string, err error) {
	// What the run's proxy may spend, and who counts its calls (usage.go).
	sp, spending := s.beginSpend(cfg, r.Agent)
	planCtx, planSpan := tracing.Tracer().Start(ctx, spanPlan)
	// Asks reach the scheduler from the run's proxy (approvals.go), and
	// its answers the proxy through prep, known once Prepare returns.
	var answerTo atomic.Pointer[runprep.Prepared]
	runOf := func() Run { return r }
	defer s.endApprovals(r.ID)
	prep, err := s.prep.Prepare(planCtx, runprep.Input{Config: cfg, Agent: r.Agent, RunID: r.ID, Attempt: r.Attempt, Overrides: r.overrides(), Spending: spending,
		Traceparent:  tracing.Traceparent(ctx),
		OnAsk:        s.onAsk(runOf, approvalTimeout(cfg, r.Agent), func(a egresspolicy.Answer) error { return answerTo.Load().Answer(a) }),
		OnAskSettled: s.onAskSettled(runOf)})
	answerTo.Store(prep)
	if prep != nil {
		backend = prep.Backend.Name()
		planSpan.SetAttributes(attribute.String("berth.backend", backend))
	}
	if err != nil {
		planSpan.SetStatus(codes.Error, failReason(err))
	}
	planSpan.End()
	if err != nil {
		s.endSpend(sp)
		return res, backend, err
	}
	sp.attach(prep)
	defer func() {
		// The run is over: its token dies with its proxy.
		rec := prep.Finish()
		s.endSpend(sp)
		res.Egress, res.EgressDropped, res.EgressCounts = rec.Decisions, rec.Dropped, rec.Counts
		res.Usage = rec.Usage
	}()
	req, refusedMCP := s.runRequest(r, prep.Agent, prep.Plan)
	if req.Message.Files, err = s.placeFiles(r, prep.Plan); err != nil {
		return res, backend, err
	}
	podFiles, err := s.podFiles(cfg, r, prep.Plan)
	if err != nil {
		return res, backend, err
	}
	started := sandboxStart(ctx)
	spec := prep.Spec(req, func(handle string) error {
		started(nil)
		s.hold(ctx, HoldBeforeHandle, r)
		if err := s.saveHandle(r.ID, backend, handle); err != nil {
			return err
		}
		s.hold(ctx, HoldBeforeAnswer, r)
		return nil
	})
	spec.Files = podFiles
	res.Result, err = prep.Backend.Run(ctx, spec)
	started(err)
	res.Response.MCP = append(refusedMCP, res.Response.MCP...)
	if err == nil && res.Response.Error == "" {
		res.files = s.takeReplyFiles(cfg, r, prep.Plan, isolation.KnownSecrets(spec), res.Result)
	}
	return res, backend, err
}

// runRequest is the request of run r of agent under plan: its message, its
// conversation's history, the plan's providers, policy and workspace, and
// its MCP servers; refusedMCP are the workspace's .mcp.json entries left
// out, for the run record.
func (s *Service) runRequest(r Run, agent config.Agent, plan isolation.Plan) (req agentproto.Request, refusedMCP []agentproto.MCPStatus) {
	servers, refusedMCP := runplan.RunMCP(agent, plan)
	return agentproto.Request{
		Version: agentproto.Version,
		RunID:   r.ID,
		Agent: agentproto.Agent{
			ID:            agent.ID,
			Name:          agent.Name,
			MaxIterations: agent.MaxIterations,
			Tools:         runplan.AgentTools(agent),
		},
		Message: agentproto.Message{
			ID:          r.MessageID,
			Connector:   r.Connector,
			Channel:     r.Channel,
			ChannelName: r.ChannelName,
			Thread:      r.Thread,
			Author:      r.Author,
			Text:        r.Text,
			ReceivedAt:  r.CreatedAt,
		},
		Provider:  plan.Providers[0],
		Fallback:  plan.Providers[1:],
		Policy:    plan.Policy,
		Workspace: plan.SandboxWorkspace,
		History:   s.history(r),
		MCP:       servers,
		WebSearch: runplan.WebSearch(agent),
	}, refusedMCP
}

// agentFacts are the host facts a run of agentID is compiled with
// (runprep.Preparer.Facts): explanations show the very plan runs get.
func (s *Service) agentFacts(cfg *config.Config, agentID string) runplan.HostFacts {
	return s.prep.Facts(cfg, agentID)
}

// hostFacts are the host facts shared by every agent (no agent's own uid).
func (s *Service) hostFacts(cfg *config.Config) runplan.HostFacts {
	return s.prep.SharedFacts(cfg)
}

// uidStore keeps the agents' uids in scheduler.db for the run preparation;
// its writes are transactions of their own (rare, one per new agent).
type uidStore struct{ st *store }

func (u uidStore) View(fn func(*bolt.Tx) error) error   { return u.st.db.View(fn) }
func (u uidStore) Update(fn func(*bolt.Tx) error) error { return u.st.update(fn) }

// saveHandle records the sandbox handle so a restarted scheduler can kill
// it. An error ends the run (isolation.Supervise kills the sandbox): a
// sandbox nobody could find after a crash must not keep running.
func (s *Service) saveHandle(runID, backend, handle string) error {
	// Through the committer: it reads the run and writes it back, so it may
	// be applied again with its group.
	ready := s.clock.Now()
	err := s.store.write(func(tx *bolt.Tx) error {
		r, ok, err := getRun(tx, runID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("run %s is not in %s", runID, DBName)
		}
		r.Backend, r.Handle, r.ReadyAt = backend, handle, ready
		return putRun(tx, r)
	})
	if err != nil {
		s.log.Error("cannot record sandbox handle; ending the run", "run_id", runID, "backend", backend, "handle", handle, "err", err)
		return fmt.Errorf("cannot record sandbox handle: %w", err)
	}
	return nil
}
