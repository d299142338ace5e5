package tools

import "net/http"

// ownTransport is the transport of berth-agent's own requests: web_fetch's
// (webTransport) on the agent's own channel at the egress proxy when the
// run has one (docs/adr/0026-agent-own-egress-channel.md).
func (e Env) ownTransport() (http.RoundTripper, error) {
	tr, err := e.webTransport()
	if err != nil || e.Own == nil {
		return tr, err
	}
	return e.Own(tr), nil
}
