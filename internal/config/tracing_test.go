package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestTracingIsOffByDefaultAndReadKeyByKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		table            string
		enabled          bool
		endpoint, proto  string
		ratio            float64
		providerTraceCtx bool
	}{
		{name: "Without a tracing table nothing is exported", proto: config.TracingHTTP, ratio: 1},
		{
			name:  "An endpoint turns it on with HTTP and every message sampled",
			table: "[tracing]\nendpoint = \"http://127.0.0.1:4318\"\n", enabled: true,
			endpoint: "http://127.0.0.1:4318", proto: config.TracingHTTP, ratio: 1,
		},
		{
			name:  "Every key is read",
			table: "[tracing]\nendpoint = \"127.0.0.1:4317\"\nprotocol = \"grpc\"\nsample_ratio = 0.25\nprovider_traceparent = true\n", enabled: true,
			endpoint: "127.0.0.1:4317", proto: config.TracingGRPC, ratio: 0.25, providerTraceCtx: true,
		},
		{
			name:  "A whole number is a ratio too",
			table: "[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0\n", enabled: true,
			endpoint: "http://127.0.0.1:4318", proto: config.TracingHTTP, ratio: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(writeConfig(t, map[string]string{"berth.toml": base + "\n" + tc.table}))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			tr := c.Tracing
			if tr.Enabled() != tc.enabled || tr.Endpoint != tc.endpoint || tr.Proto() != tc.proto || tr.Ratio() != tc.ratio || tr.ProviderTraceparent != tc.providerTraceCtx {
				t.Errorf("Tracing = %+v (ratio %v, enabled %v), want endpoint %q protocol %q ratio %v provider_traceparent %v enabled %v",
					tr, tr.Ratio(), tr.Enabled(), tc.endpoint, tc.proto, tc.ratio, tc.providerTraceCtx, tc.enabled)
			}
		})
	}
}

func TestTracingRefusesBadValuesNamingTheKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ table, want string }{
		{"[tracing]\nprotocol = \"udp\"\n", "tracing.protocol"},
		{"[tracing]\nendpoint = \"not an address\"\n", "tracing.endpoint"},
		{"[tracing]\nsample_ratio = 1.5\n", "tracing.sample_ratio"},
		{"[tracing]\nsample_ratio = -1\n", "tracing.sample_ratio"},
		{"[tracing]\nsample_ratio = \"half\"\n", "tracing.sample_ratio"},
		{"[tracing]\nexporter = \"jaeger\"\n", "tracing.exporter"},
	}
	for _, tc := range tests {
		t.Run(tc.want+"_"+strings.Fields(tc.table)[1], func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": base + "\n" + tc.table}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
