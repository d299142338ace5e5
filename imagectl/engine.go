package imagectl

import (
	"github.com/moby/moby/client"
	"go.opentelemetry.io/otel/trace/noop"
)

// NewEngineClient is a client of the engine DOCKER_HOST (or the default
// socket) names that makes no spans: the client's own tracing would take
// the tracer of the span in a call's context and export an HTTP span per
// engine call into berth's traces, and send the engine a traceparent
// (docs/adr/0025-traces.md: berth's spans only).
func NewEngineClient() (*client.Client, error) {
	return client.New(client.FromEnv, client.WithTraceProvider(noop.NewTracerProvider()))
}
