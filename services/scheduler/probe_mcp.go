package scheduler

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/runprep"
)

// ProbeMCP asks agent's MCP servers for their tools through a real run
// (berthctl sandbox explain --probe): berth-agent, started by the agent's
// backend with the agent's plan, starts the servers as a run would (stdio
// ones in its sandbox, HTTP ones through its egress proxy, which adds their
// headers) and reports each one's tools or error; no model is called. The
// workspace's refused .mcp.json entries come first, with why.
func (s *Service) ProbeMCP(agent string) ([]agentproto.MCPStatus, error) {
	cfg := s.cfg.Load()
	if _, err := cfg.Agent(agent); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeRunTimeout)
	defer cancel()
	now := s.clock.Now()
	runID := newRunID(now)
	prep, err := s.prep.Prepare(ctx, runprep.Input{Config: cfg, Agent: agent, RunID: runID})
	if err != nil {
		return nil, fmt.Errorf("cannot start the probe run of agent %s: %w", agent, err)
	}
	defer prep.Finish()
	a, plan := prep.Agent, prep.Plan
	servers, refused := runplan.RunMCP(a, plan)
	if len(servers) == 0 {
		return refused, nil
	}
	req := agentproto.Request{
		Version:   agentproto.Version,
		RunID:     runID,
		Agent:     agentproto.Agent{ID: a.ID, Name: a.Name, MaxIterations: 1, Tools: runplan.AgentTools(a)},
		Message:   agentproto.Message{ID: runID, Text: "berthctl sandbox explain --probe", ReceivedAt: now},
		Provider:  plan.Providers[0],
		Fallback:  plan.Providers[1:],
		Policy:    plan.Policy,
		Workspace: plan.SandboxWorkspace,
		MCP:       servers,
		ProbeMCP:  true,
	}
	s.log.Info("MCP probe run started", "run_id", runID, "agent", a.ID, "backend", prep.Backend.Name(), "servers", len(servers))
	res, err := prep.Backend.Run(ctx, prep.Spec(req, nil))
	if err != nil {
		return nil, fmt.Errorf("the probe run of agent %s failed: %w", agent, err)
	}
	if res.Response.Error != "" {
		return nil, errors.New(res.Response.Error)
	}
	return append(refused, recordedMCP(res.Response.MCP)...), nil
}
