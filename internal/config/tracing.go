package config

import (
	"fmt"
	"maps"
	"math"
)

// Tracing protocols: OTLP over HTTP (protobuf bodies) or over gRPC.
const (
	TracingHTTP = "http/protobuf"
	TracingGRPC = "grpc"
)

// Tracing is [tracing]: OpenTelemetry traces of every message's way
// through berth, exported over OTLP (internal/tracing). Off while Endpoint
// is empty, which is the default. It is kept as written: Proto and Ratio
// give the defaults of what no file set.
type Tracing struct {
	// Endpoint is the collector's OTLP address: "http://127.0.0.1:4318"
	// for http/protobuf (the path /v1/traces is added), "127.0.0.1:4317"
	// or "http://127.0.0.1:4317" for grpc.
	Endpoint string `toml:"endpoint" berth:"check=tracingEndpoint"`
	// Protocol is "http/protobuf" (the default) or "grpc".
	Protocol string `toml:"protocol" berth:"check=tracingProtocol"`
	// SampleRatio is the share of messages traced, from 0 to 1 (default 1).
	// A message's spans in every service follow the choice made when it
	// arrived.
	SampleRatio *float64 `toml:"sample_ratio" berth:"check=sampleRatio"`
	// ProviderTraceparent, when true, has the egress proxy send each
	// provider call the run's W3C traceparent; off, it removes any the
	// sandbox sent, so the provider learns nothing of berth's traces.
	ProviderTraceparent bool `toml:"provider_traceparent"`
}

// defaultSampleRatio traces every message once tracing is on.
const defaultSampleRatio = 1.0

// Enabled reports whether traces are exported.
func (t Tracing) Enabled() bool { return t.Endpoint != "" }

// Ratio is SampleRatio, defaulted.
func (t Tracing) Ratio() float64 {
	if t.SampleRatio == nil {
		return defaultSampleRatio
	}
	return *t.SampleRatio
}

// Proto is Protocol, defaulted.
func (t Tracing) Proto() string {
	if t.Protocol == "" {
		return TracingHTTP
	}
	return t.Protocol
}

var tracingChecks = map[string]any{
	"tracingProtocol": oneOf(TracingHTTP, TracingGRPC),
	"tracingEndpoint": func(s string) string {
		if s == "" {
			return ""
		}
		if msg := httpURL(s); msg == "" {
			return ""
		}
		if msg := valueChecks["hostPort"].(func(string) string)(s); msg == "" {
			return ""
		}
		return fmt.Sprintf("%q is neither an http(s) URL nor a host:port address", s)
	},
	"sampleRatio": func(f float64) string {
		if math.IsNaN(f) || f < 0 || f > 1 {
			return fmt.Sprintf("must be a number from 0 to 1, not %v", f)
		}
		return ""
	},
}

func init() { maps.Copy(valueChecks, tracingChecks) }
