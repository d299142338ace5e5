package egress_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// largeBytes is the size of the large download.
const largeBytes = 64 << 20

// benchUpstream serves a small answer on / and 64 MiB on /large, with its
// length, as a package index serves a file.
func benchUpstream(b *testing.B, withTLS bool) *httptest.Server {
	chunk := []byte(strings.Repeat("x", 64<<10))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/large" {
			w.Header().Set("Content-Length", strconv.Itoa(largeBytes))
			for range largeBytes / len(chunk) {
				w.Write(chunk)
			}
			return
		}
		io.WriteString(w, "ok")
	})
	srv := httptest.NewServer(h)
	if withTLS {
		srv.Close()
		srv = httptest.NewTLSServer(h)
	}
	b.Cleanup(srv.Close)
	return srv
}

// benchPaths are the three ways to the same upstream: direct; through the
// run's socket to berth-egress (what berth-agent's provider calls take);
// and the way a tool in the sandbox goes, HTTP_PROXY=127.0.0.1:<port> of
// berth-agent's loopback proxy, then the socket, then berth-egress.
func benchPaths(b *testing.B, withTLS bool) (paths map[string]*http.Client, base string) {
	up := benchUpstream(b, withTLS)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	rule, _ := isolation.ParseEgressRule("127.0.0.1:" + port)
	p := startProxy(b, egress.Policy{RunID: "bench", Token: token, Allow: []isolation.EgressRule{rule}}, egress.Options{Logger: quiet, MaxDecisions: 1})
	var tlsConf *tls.Config
	if withTLS {
		tlsConf = up.Client().Transport.(*http.Transport).TLSClientConfig
	}
	socketClient := p.client(token)
	socketClient.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = tlsConf

	loop, err := agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: p.socket, Token: token})
	if err != nil {
		b.Fatal(err)
	}
	go loop.Serve()
	b.Cleanup(func() { loop.Close() })
	sandbox := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: loop.Addr()}),
		TLSClientConfig: tlsConf,
	}}
	return map[string]*http.Client{"direct": up.Client(), "proxy": socketClient, "sandbox": sandbox}, up.URL
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

// pathOrder runs the variants in a fixed order (direct first, the
// baseline).
var pathOrder = []string{"direct", "proxy", "sandbox"}

// BenchmarkSmallRequest is the latency of a small plain-HTTP request,
// direct and through the proxy (scripts/bench-egress.sh reports the
// difference).
func BenchmarkSmallRequest(b *testing.B) {
	paths, base := benchPaths(b, false)
	for _, name := range pathOrder {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				fetch(b, paths[name], base+"/")
			}
		})
	}
}

// BenchmarkLargeDownload is the throughput of a 64 MiB plain-HTTP
// download, decided and relayed per request.
func BenchmarkLargeDownload(b *testing.B) {
	paths, base := benchPaths(b, false)
	for _, name := range pathOrder {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(largeBytes)
			for b.Loop() {
				fetch(b, paths[name], base+"/large")
			}
		})
	}
}

// BenchmarkLargeDownloadHTTPS is the throughput of a 64 MiB download over
// TLS: through the proxy it is a CONNECT tunnel (pip, npm, git).
func BenchmarkLargeDownloadHTTPS(b *testing.B) {
	paths, base := benchPaths(b, true)
	for _, name := range pathOrder {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(largeBytes)
			for b.Loop() {
				fetch(b, paths[name], base+"/large")
			}
		})
	}
}
