package egress_test

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// largeBytes is the size of the large download.
const largeBytes = 64 << 20

// benchUpstream serves a small answer, or largeBytes with its length (as a
// package index serves a file) on any path with a "large" segment: a tool's
// GET /large and a provider's POST /large/v1/chat/completions alike.
func benchUpstream(b *testing.B, withTLS bool) *httptest.Server {
	chunk := []byte(strings.Repeat("x", 64<<10))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if slices.Contains(strings.Split(r.URL.Path, "/"), "large") {
			w.Header().Set("Content-Length", strconv.Itoa(largeBytes))
			for range largeBytes / len(chunk) {
				w.Write(chunk)
			}
			return
		}
		io.WriteString(w, `{"ok":true}`)
	})
	srv := httptest.NewServer(h)
	if withTLS {
		srv.Close()
		srv = httptest.NewTLSServer(h)
	}
	b.Cleanup(srv.Close)
	return srv
}

// benchEnv is one upstream over plain HTTP and one over HTTPS, a proxy
// that allows both (as providers and as tool destinations), and berth's two
// ways to them:
//   - provider path: berth-agent's provider calls, /providers/<name>/… on
//     the run's socket, the proxy adding the key (and TLS);
//   - tool path: a tool in the sandbox, HTTP_PROXY=127.0.0.1:<port> of
//     berth-agent's relay, then the socket, then the proxy (a forwarded
//     request for http://, a CONNECT tunnel for https://).
type benchEnv struct {
	plain, secure *httptest.Server
	pol           egress.Policy
	roots         *tls.Config
}

func newBenchEnv(b *testing.B) *benchEnv {
	env := &benchEnv{plain: benchUpstream(b, false), secure: benchUpstream(b, true)}
	env.roots = env.secure.Client().Transport.(*http.Transport).TLSClientConfig
	env.pol = egress.Policy{RunID: "bench", Token: token}
	for _, up := range []struct {
		name string
		srv  *httptest.Server
	}{{"plain", env.plain}, {"secure", env.secure}} {
		for _, size := range []string{"small", "large"} {
			env.pol.Providers = append(env.pol.Providers, egress.Provider{Name: up.name + "-" + size, Kind: "openai",
				BaseURL: up.srv.URL + "/" + size + "/v1", Model: "m", Key: openKey})
		}
		rule, err := egresspolicy.ParseRule(up.srv.Listener.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		env.pol.Allow = append(env.pol.Allow, rule)
	}
	return env
}

// clients are the direct clients and the two paths' clients to a proxy
// listening on socket.
type clients struct {
	direct, directTLS, provider, tool *http.Client
	relay                             *agentegress.Proxy
}

func (env *benchEnv) clients(b *testing.B, socket string) clients {
	relay, err := agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token})
	if err != nil {
		b.Fatal(err)
	}
	go relay.Serve()
	b.Cleanup(func() { relay.Close() })
	provider := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	tool := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: relay.Addr()}), TLSClientConfig: env.roots}
	return clients{
		direct:    env.plain.Client(),
		directTLS: env.secure.Client(),
		provider:  &http.Client{Transport: &tokenRT{provider, token}},
		tool:      &http.Client{Transport: tool},
		relay:     relay,
	}
}

// benchPath is one of the four ways through the proxy with the request
// that goes the same way directly.
type benchPath struct {
	name          string
	direct, proxy func(size string) call
}

// call is one request and the client that sends it.
type call struct {
	c   *http.Client
	req *http.Request
}

func post(c *http.Client, u string) call {
	req, _ := http.NewRequest("POST", u, strings.NewReader(`{"model":"m","messages":[]}`))
	req.Header.Set("Content-Type", "application/json")
	return call{c, req}
}

func get(c *http.Client, u string) call {
	req, _ := http.NewRequest("GET", u, nil)
	return call{c, req}
}

func (env *benchEnv) paths(cs clients) []benchPath {
	return []benchPath{
		{"provider-http",
			func(size string) call {
				return post(cs.direct, env.plain.URL+"/"+size+"/v1/chat/completions")
			},
			func(size string) call {
				return post(cs.provider, "http://egress/providers/plain-"+size+"/chat/completions")
			}},
		{"provider-https",
			func(size string) call {
				return post(cs.directTLS, env.secure.URL+"/"+size+"/v1/chat/completions")
			},
			func(size string) call {
				return post(cs.provider, "http://egress/providers/secure-"+size+"/chat/completions")
			}},
		{"tool-http",
			func(size string) call { return get(cs.direct, env.plain.URL+"/"+size) },
			func(size string) call { return get(cs.tool, env.plain.URL+"/"+size) }},
		{"tool-https",
			func(size string) call { return get(cs.directTLS, env.secure.URL+"/"+size) },
			func(size string) call { return get(cs.tool, env.secure.URL+"/"+size) }},
	}
}

// exchange sends the request, reads the whole answer and says how long it
// took.
func exchange(x call) (time.Duration, error) {
	return exchangeAfter(x, func() {})
}

// exchangeAfter is exchange calling answered once the answer's header is
// in (the proxy has authenticated the connection by then).
func exchangeAfter(x call, answered func()) (time.Duration, error) {
	start := time.Now()
	resp, err := x.c.Do(x.req)
	answered()
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	elapsed := time.Since(start)
	if err != nil || resp.StatusCode != 200 {
		return 0, fmt.Errorf("%s %s: status %d, %d bytes, %v", x.req.Method, x.req.URL, resp.StatusCode, n, err)
	}
	return elapsed, nil
}

func timed(b *testing.B, x call) time.Duration {
	d, err := exchange(x)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// inProcess is a proxy in this process (for profiles), with its clients.
func inProcess(b *testing.B) (*benchEnv, clients) {
	env := newBenchEnv(b)
	p := startProxy(b, env.pol, egress.Options{Logger: quiet, RootCAs: env.roots.RootCAs})
	return env, env.clients(b, p.socket)
}

// BenchmarkSmallRequest is the latency a small request gains on each path:
// each iteration sends it directly and through the proxy, interleaved, so
// the machine's load weighs on both alike; the medians are reported.
func BenchmarkSmallRequest(b *testing.B) {
	env, cs := inProcess(b)
	for _, p := range env.paths(cs) {
		b.Run(p.name, func(b *testing.B) {
			var direct, proxied []time.Duration
			for b.Loop() {
				direct = append(direct, timed(b, p.direct("small")))
				proxied = append(proxied, timed(b, p.proxy("small")))
			}
			d, x := median(direct), median(proxied)
			b.ReportMetric(float64(d.Microseconds()), "direct-p50-us")
			b.ReportMetric(float64(x.Microseconds()), "proxy-p50-us")
			b.ReportMetric(float64((x - d).Microseconds()), "added-p50-us")
		})
	}
}

// BenchmarkLargeDownload is the throughput of a 64 MiB answer on each
// path, beside the same download directly, interleaved (which goes first
// alternates).
func BenchmarkLargeDownload(b *testing.B) {
	env, cs := inProcess(b)
	for _, p := range env.paths(cs) {
		b.Run(p.name, func(b *testing.B) {
			var direct, proxied time.Duration
			i := 0
			for b.Loop() {
				if i++; i%2 == 0 {
					proxied += timed(b, p.proxy("large"))
					direct += timed(b, p.direct("large"))
				} else {
					direct += timed(b, p.direct("large"))
					proxied += timed(b, p.proxy("large"))
				}
			}
			mbs := func(d time.Duration) float64 { return float64(i) * largeBytes / 1e6 / d.Seconds() }
			b.ReportMetric(mbs(direct), "direct-MB/s")
			b.ReportMetric(mbs(proxied), "proxy-MB/s")
			b.ReportMetric(100*direct.Seconds()/proxied.Seconds(), "%direct")
		})
	}
}

// rssStreams is how many streams run at once in BenchmarkProxyRSS: a run's
// connection limit.
const rssStreams = 32

// BenchmarkProxyRSS is the peak resident memory (VmHWM) of a real
// berth-egress process, launched as a run's is, after rssStreams
// concurrent large downloads on each of the four paths in turn.
func BenchmarkProxyRSS(b *testing.B) {
	testenv.NeedRoot(b)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		b.Fatal(err)
	}
	env := newBenchEnv(b)
	root := b.TempDir()
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", "bench", isolation.EgressSocketName)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: env.secure.Certificate().Raw})
	px, err := egress.Launch(context.Background(), env.pol, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary,
		User: nobody, Client: nobody, Socket: socket, RootCAsPEM: ca})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { px.Stop() })
	cs := env.clients(b, socket)
	paths := env.paths(cs)
	// The relay keeps idle connections to the socket after forwarded
	// requests: its round goes last, so every round gets all the run's slots.
	paths = []benchPath{paths[3], paths[1], paths[0], paths[2]}
	var streaming, mostAtOnce atomic.Int64
	for b.Loop() {
		for _, p := range paths {
			var wg sync.WaitGroup
			for range rssStreams {
				// One at a time until each is answered: the proxy holds only
				// a few connections that have not yet shown the token.
				answered := make(chan struct{})
				wg.Go(func() {
					_, err := exchangeAfter(p.proxy("large"), func() {
						mostAtOnce.Store(max(mostAtOnce.Load(), streaming.Add(1)))
						close(answered)
					})
					streaming.Add(-1)
					if err != nil {
						b.Error(err)
					}
				})
				<-answered
			}
			wg.Wait()
			cs.provider.CloseIdleConnections()
		}
	}
	hwm, err := peakRSS(px.Pid())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(hwm)/(1<<20), "VmHWM-MiB")
	b.ReportMetric(float64(mostAtOnce.Load()), "streams-at-once")
}

// peakRSS is a process's peak resident set size, in bytes.
func peakRSS(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
