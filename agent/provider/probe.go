package provider

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
)

// ProbeResult is what Probe learned about a provider.
type ProbeResult struct {
	// Verdict is "ok", "unreachable", "auth failed", "model not found" or "error".
	Verdict string
	Latency time.Duration
	Detail  string // the reply's start, or the error without the key
}

// Probe checks a provider the way a run would use it: one small chat call
// ("Reply with OK.") without tools and without retries, through the run's
// egress proxy when cfg is Proxied (berth-agent answers a probe request so). It tells
// reachability (any HTTP answer), authentication (not 401/403) and the model
// (not 404) apart, and measures the latency of the call.
func Probe(ctx context.Context, cfg agentproto.Provider) ProbeResult {
	p, err := New(cfg)
	if err != nil {
		return ProbeResult{Verdict: "error", Detail: err.Error()}
	}
	began := time.Now()
	turn, _, err := p.Complete(ctx, Conversation{Messages: []Message{{Role: RoleUser, Text: "Reply with OK."}}}, nil)
	res := ProbeResult{Latency: time.Since(began)}
	var pe *Error
	switch {
	case err == nil:
		res.Verdict, res.Detail = "ok", truncate(turn.Text, 60)
	case errors.As(err, &pe) && pe.Status == 0:
		res.Verdict, res.Detail = "unreachable", pe.Error()
	case errors.As(err, &pe) && pe.RefusedByEgress && pe.Status == http.StatusBadGateway:
		// Through the egress proxy a provider that does not answer is the
		// proxy's 502, not a connection error.
		res.Verdict, res.Detail = "unreachable", "the egress proxy cannot reach "+endpointOf(cfg)
		if pe.Msg != "" {
			res.Detail += ": " + pe.Msg
		}
	case errors.As(err, &pe) && pe.RefusedByEgress:
		res.Verdict, res.Detail = "error", "refused by the egress proxy: "+pe.Error()
	case errors.As(err, &pe) && (pe.Status == http.StatusUnauthorized || pe.Status == http.StatusForbidden):
		res.Verdict, res.Detail = "auth failed", pe.Error()
	case errors.As(err, &pe) && pe.Status == http.StatusNotFound:
		res.Verdict, res.Detail = "model not found", pe.Error()
	default:
		res.Verdict, res.Detail = "error", redactor(cfg.Key)(err.Error())
	}
	return res
}

// endpointOf is where a proxied provider's calls go beyond the proxy: its
// configured base_url, or its kind's official API.
func endpointOf(cfg agentproto.Provider) string {
	if cfg.Endpoint != "" {
		return cfg.Endpoint
	}
	return "the official " + cfg.Kind + " API"
}
