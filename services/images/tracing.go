package images

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/tracing"
)

// berth-imaged's spans (docs/adr/0025-traces.md). Each call that asks for
// an image is a span: EnsureIsolationImage (the scheduler's, a child of
// its plan span when it sends its traceparent) and a Build job (berthctl's,
// a root unless its caller sent one). Under it, resolving the target and,
// when the engine lacks the image, the build it started; a call that joins
// a build already under way links to that build instead. The build's
// stages hang under the build.
const (
	spanEnsure    = "images.ensure"
	spanJob       = "images.job"
	spanResolve   = "images.resolve"
	spanBuild     = "images.build"
	spanCheckArch = "images.check_arch"
	spanSandbox   = "images.sandbox_image"
	spanFetch     = "images.fetch_packages"
	spanAgent     = "images.agent_image"
	spanIsolation = "images.isolation_image"
)

// What a call found, its span's berth.image.outcome: the engine had the
// image, this call built it, or it waited for a build another call began.
const (
	outcomePresent = "present"
	outcomeBuilt   = "built"
	outcomeShared  = "shared"
)

// callerTrace is ctx under the caller's span, when tracing is on and the
// caller sent a traceparent. Off, a traceparent from the bus is not
// adopted: a no-op span would carry it on.
func callerTrace(ctx context.Context, traceparent string) context.Context {
	if !tracing.On() {
		return ctx
	}
	return tracing.Remote(ctx, traceparent)
}

// stage runs f as the span name under ctx's span.
func stage(ctx context.Context, name string, f func(context.Context) error, attrs ...attribute.KeyValue) error {
	ctx, span := tracing.Tracer().Start(ctx, name, trace.WithAttributes(attrs...))
	err := f(ctx)
	endSpan(span, err)
	return err
}

// endSpan ends span, failed with err's short reason when err is not nil.
// The reason, not the text: a build's error quotes its output.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, failReason(err))
	}
	span.End()
}

// failReason is the short reason of a failed call or build.
func failReason(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not found"
	case errors.Is(err, ErrInvalidArgument):
		return "invalid argument"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case canceled(err):
		return "canceled"
	}
	return "build failed"
}

// canceled says err ended a build that was canceled (a job's Cancel, the
// daemon stopping).
func canceled(err error) bool {
	return errors.Is(err, context.Canceled) || strings.Contains(err.Error(), " canceled")
}

// imageAttrs name a plan's images in a span: the target and tags, which
// are config ids and hashes.
func imageAttrs(p *plan) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("berth.image.target", p.target),
		attribute.String("berth.image.tag", p.tag),
	}
}
