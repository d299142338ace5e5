package intake

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/tracing"
)

// intake's spans of a message (docs/adr/0025-traces.md): its receive (a
// root, or the child of the traceparent a webhook's sender sent), its
// store in the inbox, each hand-off to the scheduler, and each send of its
// reply, under the scheduler's delivery span. The inbox entry keeps the
// store span's traceparent, so that a hand-off after a restart is still
// part of the message's trace; the outbox entry keeps the scheduler's.
//
// Spans carry ids and names (connector, agent, message and run ids), never
// a message's text, author or channel name.
const (
	spanReceive = "intake.receive"
	spanStore   = "intake.store"
	spanHandoff = "intake.handoff"
	spanDeliver = "intake.deliver"
)

// startReceive starts the span of a message's receive from connectorID:
// a child of traceparent when the sender sent a valid one.
func startReceive(ctx context.Context, connectorID, traceparent string) (context.Context, trace.Span) {
	return tracing.Tracer().Start(tracing.Remote(ctx, traceparent), spanReceive,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("berth.connector", connectorID)))
}

// receiveFailed marks a receive's span failed with why the message was
// refused (intake's words, never the message's).
func receiveFailed(span trace.Span, reason string) {
	span.SetStatus(codes.Error, reason)
}

// keepTraced is keep inside the store span, with the entry carrying the
// span's traceparent for the hand-off.
func (s *Service) keepTraced(ctx context.Context, keep func(inboxEntry) error, entry inboxEntry) error {
	ctx, span := tracing.Tracer().Start(ctx, spanStore, trace.WithAttributes(
		attribute.String("berth.connector", entry.Connector),
		attribute.String("berth.message_id", entry.ID),
		attribute.String("berth.agent", entry.Agent)))
	defer span.End()
	entry.Traceparent = tracing.Traceparent(ctx)
	err := keep(entry)
	if err != nil {
		span.SetStatus(codes.Error, "cannot store the message")
	}
	return err
}

// handoff is a hand-off's span and the Submission that carries it.
type handoff struct {
	sub  busapi.Submission
	span trace.Span
}

// startHandoff starts the span of one hand-off of m.
func startHandoff(ctx context.Context, m inboxEntry, attempt int) handoff {
	ctx, span := tracing.Tracer().Start(tracing.Remote(ctx, m.Traceparent), spanHandoff,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("berth.connector", m.Connector),
			attribute.String("berth.message_id", m.ID),
			attribute.String("berth.agent", m.Agent),
			attribute.Int("berth.attempt", attempt)))
	sub := submission(m)
	sub.Traceparent = tracing.Traceparent(ctx)
	return handoff{sub: sub, span: span}
}

// end ends the hand-off's span with the scheduler's answer.
func (h handoff) end(runID string, err error) {
	if err != nil {
		h.span.SetStatus(codes.Error, "the scheduler did not take the message")
	} else {
		h.span.SetAttributes(attribute.String("berth.run_id", runID))
	}
	h.span.End()
}

// startDeliver starts the span of one send of reply r, under the
// scheduler's delivery span.
func startDeliver(ctx context.Context, r outboxEntry) (context.Context, trace.Span) {
	return tracing.Tracer().Start(tracing.Remote(ctx, r.Traceparent), spanDeliver,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("berth.connector", r.Connector),
			attribute.String("berth.message_id", r.MessageID),
			attribute.String("berth.run_id", r.RunID),
			attribute.Int("berth.attempt", r.Attempts+1)))
}

// validTraceparent is tp made again from what it parses to, "" when it is
// not a valid one.
func validTraceparent(tp string) string {
	return tracing.Traceparent(tracing.Remote(context.Background(), tp))
}

// traceReceive starts a webhook's receive span, a child of the request's
// traceparent header; the span ends with done, failed when the answer is
// an error (4xx, 5xx).
func traceReceive(w http.ResponseWriter, r *http.Request, connectorID string) (http.ResponseWriter, context.Context, func()) {
	inbound := ""
	if tracing.On() {
		inbound = r.Header.Get("Traceparent")
	}
	ctx, span := startReceive(r.Context(), connectorID, inbound)
	sw := &statusWriter{ResponseWriter: w}
	return sw, ctx, func() {
		if sw.code != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		}
		if sw.code >= 400 {
			receiveFailed(span, http.StatusText(sw.code))
		}
		span.End()
	}
}

// statusWriter keeps the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
