package scheduler

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/isolation"
)

// The scheduler's spans (docs/adr/0025-traces.md). A run's spans hang under
// intake's hand-off span, whose traceparent the Submission carried and the
// run record keeps: the queue span (queued → started), the run span, and
// under that the plan, the sandbox start, berth-agent's replayed records and
// the egress decisions. The delivery span is the parent of intake's.
const (
	spanQueue        = "scheduler.queue"
	spanRun          = "scheduler.run"
	spanPlan         = "scheduler.plan"
	spanSandboxStart = "sandbox.start"
	spanDeliver      = "scheduler.deliver"
	// spanScheduleFire is the root of a fired job's trace: a firing has no
	// message, so its run's spans hang under this one instead.
	spanScheduleFire = "scheduler.schedule.fire"
)

// traceparentOf is a Submission's traceparent as the run keeps it: made
// again from what it parses to, "" when it is not a valid one (it came over
// the bus, from intake).
func traceparentOf(tp string) string {
	return tracing.Traceparent(tracing.Remote(context.Background(), tp))
}

// traced is the context of r's message: the remote hand-off span.
func traced(ctx context.Context, r Run) context.Context {
	return tracing.Remote(ctx, r.Traceparent)
}

// runAttrs name a run in its spans: ids and names, never its text.
func runAttrs(r Run) trace.SpanStartEventOption {
	return trace.WithAttributes(
		attribute.String("berth.run_id", r.ID),
		attribute.String("berth.agent", r.Agent),
		attribute.String("berth.connector", r.Connector),
		attribute.Int("berth.attempt", r.Attempt),
	)
}

// startRunSpans records r's wait in its queue (from its creation until now)
// and starts its run span, which runCtx carries.
func startRunSpans(ctx context.Context, r Run) (runCtx context.Context, span trace.Span) {
	parent := traced(ctx, r)
	tr := tracing.Tracer()
	_, queue := tr.Start(parent, spanQueue, trace.WithTimestamp(r.CreatedAt), runAttrs(r))
	queue.End()
	return tr.Start(parent, spanRun, runAttrs(r))
}

// endRunSpan replays what berth-agent reported (its loop, model and tool
// calls) and the run's egress decisions under span, then ends it, failed
// when the run was.
func endRunSpan(ctx context.Context, span trace.Span, started time.Time, res isolation.Result, runErr error, state string) {
	if span.IsRecording() {
		now := time.Now()
		recs := tracing.AgentRecords(res.Response.Spans, started, now)
		recs = tracing.EgressRecords(recs, res.Egress, started, now)
		tracing.Replay(ctx, recs)
		span.SetAttributes(attribute.String("berth.state", state))
		if d := res.Response.SpansDropped; d > 0 {
			span.SetAttributes(attribute.Int("berth.agent.spans_dropped", d))
		}
		// The status names the reason only: an error's text may quote what
		// the agent read or said.
		switch {
		case runErr != nil:
			span.SetStatus(codes.Error, failReason(runErr))
		case res.Response.Error != "":
			span.SetStatus(codes.Error, "the agent failed")
		}
	}
	span.End()
}

// sandboxStart is the span of a sandbox's start, from now until done is
// called (the backend reported its handle, or the run ended without).
func sandboxStart(ctx context.Context) (done func(error)) {
	_, span := tracing.Tracer().Start(ctx, spanSandboxStart)
	ended := false
	return func(err error) {
		if ended {
			return
		}
		ended = true
		if err != nil {
			span.SetStatus(codes.Error, failReason(err))
		}
		span.End()
	}
}

// failReason is the short reason of a run's error, for a span's status.
func failReason(err error) string {
	if r := isolation.ReasonOf(err); r != "" {
		return r
	}
	return isolation.ReasonInternal
}

// runLog is s.log naming r, with its trace id (TRACE_ID in the journal)
// when it has one.
func (s *Service) runLog(r Run) *slog.Logger {
	log := s.log.With("run_id", r.ID, "agent", r.Agent)
	if r.TraceID != "" {
		log = log.With("trace_id", r.TraceID)
	}
	return log
}
