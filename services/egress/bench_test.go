package egress_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// benchUpstream serves a small answer on / and 64 MiB on /large.
func benchUpstream(b *testing.B) *httptest.Server {
	chunk := []byte(strings.Repeat("x", 64<<10))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/large" {
			for range 1024 {
				w.Write(chunk)
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchClients(b *testing.B) (direct, proxied *http.Client, base string) {
	up := benchUpstream(b)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	rule, _ := isolation.ParseEgressRule("127.0.0.1:" + port)
	p := startProxy(b, egress.Policy{RunID: "bench", Token: token, Allow: []isolation.EgressRule{rule}}, egress.Options{Logger: quiet, MaxDecisions: 1})
	return up.Client(), p.client(token), up.URL
}

func fetch(b *testing.B, c *http.Client, url string) int64 {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return n
}

// BenchmarkSmallRequest is the latency of a small plain-HTTP request,
// direct and through the proxy (scripts/bench-egress.sh reports the difference).
func BenchmarkSmallRequest(b *testing.B) {
	direct, proxied, base := benchClients(b)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			fetch(b, direct, base+"/")
		}
	})
	b.Run("proxy", func(b *testing.B) {
		for b.Loop() {
			fetch(b, proxied, base+"/")
		}
	})
}

// BenchmarkLargeDownload is the throughput of a 64 MiB download.
func BenchmarkLargeDownload(b *testing.B) {
	direct, proxied, base := benchClients(b)
	for name, c := range map[string]*http.Client{"direct": direct, "proxy": proxied} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for b.Loop() {
				fetch(b, c, base+"/large")
			}
		})
	}
}
