package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
)

// probeCallTimeout bounds each provider's probe call; the calls run side by
// side, so a probe answers within about this long.
const probeCallTimeout = 20 * time.Second

// probe answers a request with Probe set (berthctl providers test): one
// minimal call per provider of the request, made as the run's own calls
// are (a proxied provider through the egress proxy, which adds the key).
func probe(ctx context.Context, req agentproto.Request, log *slog.Logger) agentproto.Response {
	resp := agentproto.Response{Version: agentproto.Version, RunID: req.RunID, Reply: "probed"}
	providers := append([]agentproto.Provider{req.Provider}, req.Fallback...)
	resp.Probes = make([]agentproto.ProbeResult, len(providers))
	var wg sync.WaitGroup
	for i, p := range providers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, probeCallTimeout)
			defer cancel()
			r := provider.Probe(ctx, p)
			resp.Probes[i] = agentproto.ProbeResult{Provider: p.Name, Verdict: r.Verdict, LatencyMS: r.Latency.Milliseconds(), Detail: r.Detail}
			log.Info("provider probed", "provider", p.Name, "verdict", r.Verdict, "latency", r.Latency)
		})
	}
	wg.Wait()
	return resp
}
