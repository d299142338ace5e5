// Package otlpsink is a real OTLP receiver for tests: the OpenTelemetry
// Collector's own otlpreceiver (HTTP and gRPC) on the loopback, feeding a
// consumertest sink, with the spans it got flattened for assertions.
package otlpsink

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
)

// Sink is a running receiver.
type Sink struct {
	// HTTP is the OTLP/HTTP endpoint ("http://127.0.0.1:PORT"), GRPC the
	// OTLP/gRPC one ("127.0.0.1:PORT").
	HTTP, GRPC string
	got        *consumertest.TracesSink
}

// Span is one received span.
type Span struct {
	Service                   string
	TraceID, SpanID, ParentID string
	Name                      string
	Start, End                time.Time
	Attributes                map[string]string
	// Error is the status message of a span whose status is Error; Failed
	// says its status is Error.
	Error  string
	Failed bool
}

// Start starts a receiver, stopped when the test ends.
func Start(t testing.TB) *Sink {
	t.Helper()
	s := &Sink{got: new(consumertest.TracesSink)}
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC.GetOrInsertDefault().NetAddr.Endpoint = grpcAddr
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = httpAddr
	var set receiver.Settings = receivertest.NewNopSettings(factory.Type())
	set.ID = component.NewIDWithName(factory.Type(), fmt.Sprintf("%s-%s", t.Name(), httpAddr))
	r, err := factory.CreateTraces(context.Background(), set, cfg, s.got)
	if err != nil {
		t.Fatalf("cannot create the OTLP receiver: %v", err)
	}
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatalf("cannot start the OTLP receiver: %v", err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	s.HTTP, s.GRPC = "http://"+httpAddr, grpcAddr
	return s
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Spans are every span received so far, in the order they arrived.
func (s *Sink) Spans() []Span {
	var out []Span
	for _, td := range s.got.AllTraces() {
		rss := td.ResourceSpans()
		for i := range rss.Len() {
			rs := rss.At(i)
			service := ""
			if v, ok := rs.Resource().Attributes().Get("service.name"); ok {
				service = v.AsString()
			}
			sss := rs.ScopeSpans()
			for j := range sss.Len() {
				spans := sss.At(j).Spans()
				for k := range spans.Len() {
					out = append(out, flatten(service, spans.At(k)))
				}
			}
		}
	}
	return out
}

func flatten(service string, sp ptrace.Span) Span {
	attrs := map[string]string{}
	sp.Attributes().Range(func(k string, v pcommon.Value) bool {
		attrs[k] = v.AsString()
		return true
	})
	out := Span{
		Service: service, TraceID: sp.TraceID().String(), SpanID: sp.SpanID().String(),
		Name: sp.Name(), Start: sp.StartTimestamp().AsTime(), End: sp.EndTimestamp().AsTime(),
		Attributes: attrs, Failed: sp.Status().Code() == ptrace.StatusCodeError, Error: sp.Status().Message(),
	}
	if !sp.ParentSpanID().IsEmpty() {
		out.ParentID = sp.ParentSpanID().String()
	}
	return out
}

// Wait returns the spans received once done says they are enough, failing
// the test after timeout with what arrived.
func (s *Sink) Wait(t testing.TB, timeout time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := s.Spans()
		if done(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			for _, sp := range spans {
				t.Logf("span %s %s/%s parent %q %v", sp.Service, sp.TraceID, sp.SpanID, sp.ParentID, sp.Name)
			}
			t.Fatalf("the receiver got %d spans in %v, not the ones awaited", len(spans), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
