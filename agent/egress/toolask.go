package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// ToolAsker asks the run's egress proxy whether a tool call may run
// (egresspolicy.ToolAskPath), on berth-agent's own channel: straight to
// the run's socket with the agent token, which no tool holds. The proxy
// holds the question until a person answers or approval_timeout passes, so
// the call waits as long as that, or until ctx ends. Nil when the request
// has no agent token or socket: nobody can be asked.
func ToolAsker(e agentproto.Egress) func(ctx context.Context, tool, command string) (egresspolicy.ToolAskAnswer, error) {
	if e.AgentToken == "" || e.Socket == "" {
		return nil
	}
	network, addr := "unix", e.Socket
	if a, ok := strings.CutPrefix(e.Socket, "tcp:"); ok {
		network, addr = "tcp", a
	}
	// No response timeout: a person may take until approval_timeout.
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		Proxy: nil,
	}}
	auth := "Bearer " + e.AgentToken
	return func(ctx context.Context, tool, command string) (egresspolicy.ToolAskAnswer, error) {
		body, err := json.Marshal(egresspolicy.ToolAskRequest{Tool: tool, Command: command})
		if err != nil {
			return egresspolicy.ToolAskAnswer{}, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://egress"+egresspolicy.ToolAskPath, bytes.NewReader(body))
		if err != nil {
			return egresspolicy.ToolAskAnswer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Proxy-Authorization", auth)
		resp, err := client.Do(req)
		if err != nil {
			return egresspolicy.ToolAskAnswer{}, fmt.Errorf("cannot reach the run's egress proxy: %w", err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return egresspolicy.ToolAskAnswer{}, fmt.Errorf("cannot read the proxy's answer: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return egresspolicy.ToolAskAnswer{}, fmt.Errorf("the run's egress proxy answered %s: %s", resp.Status, strings.TrimSpace(string(data)))
		}
		var ans egresspolicy.ToolAskAnswer
		if err := json.Unmarshal(data, &ans); err != nil {
			return egresspolicy.ToolAskAnswer{}, fmt.Errorf("cannot read the proxy's answer: %w", err)
		}
		return ans, nil
	}
}
