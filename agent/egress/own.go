package egress

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/internal/agentproto"
)

// OwnChannel is how berth-agent sends its own requests (web_search,
// berth.toml's MCP servers): straight to the run's socket with the agent
// token, never through the loopback proxy its tools use, so no tool can
// send a request on this channel (docs/adr/0026-agent-own-egress-channel.md).
// It wraps base (whose TLS roots and timeouts it keeps); nil when the
// request has no agent token: berth-agent's requests then go the tools'
// way and get what tools get.
func OwnChannel(e agentproto.Egress) func(base *http.Transport) http.RoundTripper {
	if e.AgentToken == "" || e.Socket == "" {
		return nil
	}
	network, addr := "unix", e.Socket
	if a, ok := strings.CutPrefix(e.Socket, "tcp:"); ok {
		network, addr = "tcp", a
	}
	auth := "Bearer " + e.AgentToken
	return func(base *http.Transport) http.RoundTripper {
		tr := base.Clone()
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "egress"})
		tr.ProxyConnectHeader = http.Header{"Proxy-Authorization": {auth}}
		return ownTransport{tr: tr, auth: auth}
	}
}

// ownTransport adds the agent token to plain HTTP requests, which go to
// the proxy as they are; an https request carries it in its CONNECT only,
// never inside the tunnel to the origin.
type ownTransport struct {
	tr   *http.Transport
	auth string
}

func (o ownTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "http" {
		r = r.Clone(r.Context())
		r.Header.Set("Proxy-Authorization", o.auth)
	}
	return o.tr.RoundTrip(r)
}

// CloseIdleConnections closes the channel's idle connections to the proxy.
func (o ownTransport) CloseIdleConnections() { o.tr.CloseIdleConnections() }
