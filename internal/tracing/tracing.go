// Package tracing is berth's OpenTelemetry setup: one trace per message,
// from intake's receive to the reply's delivery, exported over OTLP (HTTP
// or gRPC) by berth-intake, berth-scheduler and berth-imaged when [tracing]
// endpoint is set, and nothing at all otherwise ([ADR 25](../../docs/adr/0025-traces.md)).
//
// The trace context crosses each boundary as a W3C traceparent string:
// in an inbox entry (intake.db), a Submission and a Reply (D-Bus), a run's
// record (scheduler.db), an image call's options (D-Bus) and the egress
// proxy's policy. berth-agent never
// exports: it reports its spans as records in its response (agentproto),
// and the scheduler replays them (Replay) under the run's span.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/version"
)

// Name is the instrumentation scope of every berth span.
const Name = "github.com/berth-dev/berth"

// Export timing: spans leave in batches at least this often, each export
// bounded by exportTimeout, and a stopping daemon waits at most
// shutdownTimeout for the last batch.
const (
	batchTimeout    = time.Second
	exportTimeout   = 10 * time.Second
	shutdownTimeout = 5 * time.Second
)

// Setup installs the process's tracer provider for cfg and returns what
// flushes and stops it (call it once, as the daemon exits). With tracing
// off it installs nothing: every span is a no-op, and no traceparent is
// made. service is the OTel service.name ("berth-intake").
func Setup(cfg config.Tracing, service string, log *slog.Logger) (shutdown func(), err error) {
	if !cfg.Enabled() {
		return func() {}, nil
	}
	exp, err := exporter(cfg)
	if err != nil {
		return func() {}, err
	}
	res := resource.NewSchemaless(semconv.ServiceName(service), semconv.ServiceVersion(version.String()))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout), sdktrace.WithExportTimeout(exportTimeout)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.Ratio()))),
	)
	// berth's own provider, not the global one: libraries that trace
	// through the global provider (the Docker client's otelhttp) stay
	// no-ops, so a message's trace holds berth's spans only and no
	// traceparent is sent to the engine.
	provider.Store(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("cannot export traces", "err", err)
	}))
	log.Info("tracing on", "endpoint", cfg.Endpoint, "protocol", cfg.Proto(), "sample_ratio", cfg.Ratio())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("cannot flush traces", "err", err)
		}
		provider.CompareAndSwap(tp, nil)
	}, nil
}

// exporter is cfg's OTLP exporter. An http(s) URL without a path gets the
// standard /v1/traces; host:port without a scheme is plain text, as on
// the loopback a local collector listens on.
func exporter(cfg config.Tracing) (sdktrace.SpanExporter, error) {
	host, path, insecure, err := endpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	switch cfg.Proto() {
	case config.TracingGRPC:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(host), otlptracegrpc.WithTimeout(exportTimeout)}
		if insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		return otlptracegrpc.New(ctx, opts...)
	case config.TracingHTTP:
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(host), otlptracehttp.WithTimeout(exportTimeout)}
		if path != "" && path != "/" {
			opts = append(opts, otlptracehttp.WithURLPath(path))
		}
		if insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return otlptracehttp.New(ctx, opts...)
	}
	return nil, fmt.Errorf("unknown tracing protocol %q", cfg.Protocol)
}

func endpoint(s string) (host, path string, insecure bool, err error) {
	if !strings.Contains(s, "://") {
		return s, "", true, nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "", "", false, fmt.Errorf("tracing endpoint %q is not a URL", s)
	}
	switch u.Scheme {
	case "http":
		return u.Host, u.Path, true, nil
	case "https":
		return u.Host, u.Path, false, nil
	}
	return "", "", false, fmt.Errorf("tracing endpoint %q: scheme %q is neither http nor https", s, u.Scheme)
}

// provider is the one Setup installed, nil while tracing is off.
var provider atomic.Pointer[sdktrace.TracerProvider]

// Tracer is berth's tracer from the provider Setup installed, a no-op one
// while tracing is off.
func Tracer() trace.Tracer {
	if tp := provider.Load(); tp != nil {
		return tp.Tracer(Name)
	}
	return noop.NewTracerProvider().Tracer(Name)
}

// On reports whether Setup installed an exporting provider. Off, a
// traceparent that came from outside (a webhook's header) must not be
// adopted: no-op spans carry their parent's context along.
func On() bool { return provider.Load() != nil }

var propagator = propagation.TraceContext{}

// Traceparent is the W3C traceparent of ctx's span, "" when ctx has no
// valid span context (tracing off).
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c.Get("traceparent")
}

// Remote is ctx with traceparent as its remote parent; ctx itself when
// traceparent is empty or not a valid one.
func Remote(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// TraceID is the trace id (32 hex digits) of traceparent, "" when it is
// not a valid one.
func TraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(Remote(context.Background(), traceparent))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// SampledTraceID is TraceID of traceparent when it is sampled (its spans
// are exported), "" otherwise: what a run record names.
func SampledTraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(Remote(context.Background(), traceparent))
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	return sc.TraceID().String()
}

// Fail marks span failed with err (nil: nothing).
func Fail(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// Record is one span told after the fact: the agent's spans and the
// egress proxy's decisions. Parent indexes the record it is a child of
// (earlier in the list), -1 for the span Replay is given.
type Record struct {
	Name       string
	Parent     int
	Start, End time.Time
	Attributes []attribute.KeyValue
	Error      string
}

// ErrParent is why Replay left out a record whose parent is not an
// earlier record.
var ErrParent = errors.New("parent is not an earlier record")

// Replay makes a span of each record, in order, under ctx's span or the
// record its Parent names, with the record's times, and returns the
// context of each (for records to hang under). A record naming a parent
// that is not earlier in the list is made a child of ctx's span.
func Replay(ctx context.Context, recs []Record) []context.Context {
	tr := Tracer()
	ctxs := make([]context.Context, len(recs))
	for i, rec := range recs {
		parent := ctx
		if rec.Parent >= 0 && rec.Parent < i {
			parent = ctxs[rec.Parent]
		}
		end := rec.End
		if end.Before(rec.Start) {
			end = rec.Start
		}
		c, span := tr.Start(parent, rec.Name, trace.WithTimestamp(rec.Start), trace.WithAttributes(rec.Attributes...))
		if rec.Error != "" {
			span.SetStatus(codes.Error, rec.Error)
		}
		span.End(trace.WithTimestamp(end))
		ctxs[i] = c
	}
	return ctxs
}
