package agent

import (
	"context"
	"log/slog"

	"github.com/berth-dev/berth/agent/confine"
	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/agent/tools"
	"github.com/berth-dev/berth/internal/agentproto"
)

// toolEnv is where a run's tools and MCP servers run: the workspace, its
// TMPDIR, the proxy's variables, started through launcher.
func toolEnv(req agentproto.Request, tmp string, launcher *confine.Launcher) tools.Env {
	env := tools.Env{Workspace: req.Workspace, TmpDir: tmp, Network: req.Policy.Network || req.Egress != nil, Processes: launcher}
	if req.Egress != nil {
		env.ProxyEnv, env.ProxyURL, env.CABundle = agentegress.EnvFor(*req.Egress), "http://"+req.Egress.ProxyAddr, req.Egress.CABundle
		env.Own = agentegress.OwnChannel(*req.Egress)
	}
	return env
}

// probeMCP answers a request with ProbeMCP set: the MCP servers start as a
// run's would, in its sandbox, and each one's tools (or its error) are the
// answer; they end with it.
func probeMCP(ctx context.Context, req agentproto.Request, env tools.Env, log *slog.Logger) agentproto.Response {
	servers := tools.ConnectMCP(ctx, env, req.MCP, log)
	defer servers.Close()
	return agentproto.Response{Version: agentproto.Version, RunID: req.RunID, Reply: "probed", MCP: servers.Status()}
}
