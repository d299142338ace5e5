package agentproto

import "time"

// Span records (docs/adr/0025-traces.md): berth-agent reports the spans of
// its run — the loop, each model call, each tool call — in its response,
// and the scheduler makes them real spans under the run's span. The agent
// never exports a trace itself: its only way out is the run's egress proxy.
// A record names no secret and no text of the conversation: a span's name,
// its times, a few attributes (a tool's name, token counts) and an error.

// Span caps: the agent keeps at most MaxSpans records (SpansDropped counts
// the others) and at most MaxSpanAttributes attributes each; the scheduler
// holds whatever an agent wrote to the same caps, and cuts every name, key
// and value to MaxSpanText bytes.
const (
	MaxSpans          = 256
	MaxSpanAttributes = 16
	MaxSpanText       = 256
)

// Span names berth-agent reports.
const (
	SpanLoop = "agent.loop"
	SpanLLM  = "llm.call"
	SpanTool = "tool.call"
)

// SpanRecord is one span of the agent's run.
type SpanRecord struct {
	Name string `json:"name"`
	// Parent is the index of an earlier record this one is a child of, or
	// -1 for a child of the run's span.
	Parent     int               `json:"parent"`
	Start      time.Time         `json:"start"`
	End        time.Time         `json:"end"`
	Attributes map[string]string `json:"attributes,omitempty"`
	// Error, when set, marks the span failed and says why.
	Error string `json:"error,omitempty"`
}
