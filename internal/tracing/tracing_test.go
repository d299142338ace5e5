package tracing_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/otlpsink"
	"github.com/berth-dev/berth/internal/tracing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestOffMakesNoTraceparent(t *testing.T) {
	shutdown, err := tracing.Setup(config.Tracing{}, "berth-test", quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	if tracing.On() {
		t.Error("tracing off, but On says it is on")
	}
	ctx, span := tracing.Tracer().Start(context.Background(), "x")
	defer span.End()
	if tp := tracing.Traceparent(ctx); tp != "" {
		t.Errorf("tracing off, but a span has traceparent %q", tp)
	}
}

func TestTraceparentCrossesAsTextAndKeepsTheTraceID(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := tracing.TraceID(tp); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("TraceID = %q", got)
	}
	if got := tracing.Traceparent(tracing.Remote(context.Background(), tp)); got != tp {
		t.Errorf("Remote then Traceparent = %q, want %q", got, tp)
	}
	if got := tracing.SampledTraceID(tp); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("SampledTraceID = %q", got)
	}
	if got := tracing.SampledTraceID(strings.TrimSuffix(tp, "01") + "00"); got != "" {
		t.Errorf("SampledTraceID of an unsampled traceparent = %q, want none", got)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if got := tracing.TraceID(bad); got != "" {
			t.Errorf("TraceID(%q) = %q, want none", bad, got)
		}
	}
}

// Each protocol exports to the Collector's own OTLP receiver: a span, its
// child through a traceparent (as across D-Bus), and replayed records
// (as berth-agent's) with their own times, parents and status.
func TestSpansReachARealOTLPReceiverOverHTTPAndGRPC(t *testing.T) {
	sink := otlpsink.Start(t)
	for _, tc := range []struct{ proto, endpoint string }{
		{config.TracingHTTP, sink.HTTP},
		{config.TracingGRPC, sink.GRPC},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			shutdown, err := tracing.Setup(config.Tracing{Endpoint: tc.endpoint, Protocol: tc.proto}, "berth-test-"+tc.proto, quiet)
			if err != nil {
				t.Fatal(err)
			}
			// Only berth's spans: a library tracing through the global
			// provider (the Docker client) exports nothing.
			if _, lib := otel.Tracer("a-library").Start(context.Background(), "lib"); lib.IsRecording() || !tracing.On() {
				t.Errorf("the global provider records (%v), or tracing is not on (%v)", lib.IsRecording(), tracing.On())
			}
			ctx, root := tracing.Tracer().Start(context.Background(), "root")
			tp := tracing.Traceparent(ctx)
			_, child := tracing.Tracer().Start(tracing.Remote(context.Background(), tp), "child")
			tracing.Fail(child, errors.New("it broke"))
			child.End()
			t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
			tracing.Replay(ctx, []tracing.Record{
				{Name: "loop", Parent: -1, Start: t0, End: t0.Add(3 * time.Second)},
				{Name: "call", Parent: 0, Start: t0.Add(time.Second), End: t0.Add(2 * time.Second), Attributes: []attribute.KeyValue{attribute.String("k", "v")}, Error: "refused"},
				{Name: "orphan", Parent: 7, Start: t0, End: t0},
			})
			root.End()
			shutdown() // flushes

			traceID := tracing.TraceID(tp)
			byName := map[string]otlpsink.Span{}
			for _, sp := range sink.Spans() {
				if sp.TraceID == traceID {
					byName[sp.Name] = sp
				}
			}
			r, c, loop, call, orphan := byName["root"], byName["child"], byName["loop"], byName["call"], byName["orphan"]
			if len(byName) != 5 || r.Service != "berth-test-"+tc.proto {
				t.Fatalf("got spans %v of service %q, want root, child, loop, call, orphan", byName, r.Service)
			}
			if r.ParentID != "" || c.ParentID != r.SpanID || loop.ParentID != r.SpanID || call.ParentID != loop.SpanID || orphan.ParentID != r.SpanID {
				t.Errorf("parents: root %q child %q loop %q call %q orphan %q; want -, root, root, loop, root", r.ParentID, c.ParentID, loop.ParentID, call.ParentID, orphan.ParentID)
			}
			if !c.Failed || c.Error != "it broke" || !call.Failed || call.Error != "refused" || call.Attributes["k"] != "v" || loop.Failed {
				t.Errorf("status or attributes lost: child %+v call %+v loop %+v", c, call, loop)
			}
			if !loop.Start.Equal(t0) || !loop.End.Equal(t0.Add(3*time.Second)) || !call.Start.Equal(t0.Add(time.Second)) {
				t.Errorf("replayed times lost: loop %v-%v call %v", loop.Start, loop.End, call.Start)
			}
		})
	}
}
