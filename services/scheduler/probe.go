package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runprep"
)

// A provider check is a run: berth-agent, started by the agent's backend
// with the agent's plan, calls each provider once through the path its
// runs' calls take (its egress proxy adds the key, which never enters the
// sandbox) and reports each verdict (agentproto.Request.Probe). So a pass
// means runs reach the model, and the scheduler links no model SDK.

// probeRunTimeout bounds a probe run, sandbox start and egress proxy
// included; the agent bounds each call itself, and the calls run side by side.
const probeRunTimeout = 90 * time.Second

// probeAgent is the agent whose runs a provider check stands for: the
// first configured one that uses the provider, else the first one. ok is
// false when no agent is configured.
func probeAgent(cfg *config.Config, name string) (id string, ok bool) {
	ids := cfg.AgentIDs()
	if len(ids) == 0 {
		return "", false
	}
	for _, id := range ids {
		a, err := cfg.Agent(id)
		if err != nil {
			continue
		}
		chain, err := cfg.ProviderChain(a, func(string) string { return "set" })
		if err == nil && slices.ContainsFunc(chain, func(p agentproto.Provider) bool { return p.Name == name }) {
			return id, true
		}
	}
	return ids[0], true
}

// probeConfig is cfg with agentID's provider chain made exactly names, each
// with its own configured model (the check is of the provider, not of the
// agent's model override).
func probeConfig(cfg *config.Config, agentID string, names []string) *config.Config {
	c := *cfg
	c.Agents = slices.Clone(cfg.Agents)
	for i := range c.Agents {
		if c.Agents[i].ID == agentID {
			c.Agents[i].Provider, c.Agents[i].Model = names[0], ""
		}
	}
	c.AgentDefaults.Model = ""
	c.Providers.Fallback = slices.Clone(names[1:])
	return &c
}

// probeProviders checks names (remote providers whose keys the scheduler
// has) with one probe run per agent they stand for, side by side, and
// returns each provider's result.
func (s *Service) probeProviders(cfg *config.Config, names []string) map[string]agentproto.ProbeResult {
	out := make(map[string]agentproto.ProbeResult, len(names))
	byAgent := map[string][]string{}
	var order []string
	for _, n := range names {
		id, ok := probeAgent(cfg, n)
		if !ok {
			out[n] = agentproto.ProbeResult{Provider: n, Verdict: "error", Detail: "no agent is configured: a provider is checked by a run of an agent"}
			continue
		}
		if _, seen := byAgent[id]; !seen {
			order = append(order, id)
		}
		byAgent[id] = append(byAgent[id], n)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range order {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), probeRunTimeout)
			defer cancel()
			probes, err := s.probeRun(ctx, cfg, id, byAgent[id])
			mu.Lock()
			defer mu.Unlock()
			for _, n := range byAgent[id] {
				i := slices.IndexFunc(probes, func(p agentproto.ProbeResult) bool { return p.Provider == n })
				switch {
				case err != nil:
					out[n] = agentproto.ProbeResult{Provider: n, Verdict: "error", Detail: fmt.Sprintf("the check's run of agent %s failed: %v", id, err)}
				case i < 0:
					out[n] = agentproto.ProbeResult{Provider: n, Verdict: "error", Detail: fmt.Sprintf("the check's run of agent %s did not report it", id)}
				default:
					out[n] = probes[i]
				}
			}
		})
	}
	wg.Wait()
	return out
}

// probeRun starts one run of agentID that only probes names, prepared as
// runOnce's runs are (runprep.Preparer.Prepare): the agent's backend,
// workspace, user, image and egress proxy.
func (s *Service) probeRun(ctx context.Context, cfg *config.Config, agentID string, names []string) ([]agentproto.ProbeResult, error) {
	cfg = probeConfig(cfg, agentID, names)
	now := s.clock.Now()
	runID := newRunID(now)
	prep, err := s.prep.Prepare(ctx, runprep.Input{Config: cfg, Agent: agentID, RunID: runID})
	if err != nil {
		return nil, err
	}
	defer prep.Finish()
	agent, plan := prep.Agent, prep.Plan
	req := agentproto.Request{
		Version:   agentproto.Version,
		RunID:     runID,
		Agent:     agentproto.Agent{ID: agent.ID, Name: agent.Name, MaxIterations: 1},
		Message:   agentproto.Message{ID: runID, Text: "berthctl providers test", ReceivedAt: now},
		Provider:  plan.Providers[0],
		Fallback:  plan.Providers[1:],
		Policy:    plan.Policy,
		Workspace: plan.SandboxWorkspace,
		Probe:     true,
	}
	s.log.Info("provider check run started", "run_id", runID, "agent", agent.ID, "backend", prep.Backend.Name(), "providers", names)
	res, err := prep.Backend.Run(ctx, prep.Spec(req, nil))
	if err != nil {
		return nil, err
	}
	if res.Response.Error != "" {
		return nil, errors.New(res.Response.Error)
	}
	return res.Response.Probes, nil
}
