package isolation_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// writingSandbox also writes to the agent's stderr, as a tool's leak would.
type writingSandbox struct {
	*scripted
	stderr  io.Writer
	errText string
}

func (w *writingSandbox) Wait(ctx context.Context) (isolation.Exit, error) {
	io.WriteString(w.stderr, w.errText)
	return w.scripted.Wait(ctx)
}

func TestKnownSecretsAreRedactedFromWhatARunReturns(t *testing.T) {
	t.Parallel()
	const key, token = "sk-live-KEY-0123456789", "egress-token-abcdef012345"
	resp := agentproto.Response{Version: 1, RunID: "r1", Reply: "your key is " + key,
		ToolCalls: []agentproto.ToolCall{{Name: "shell", Args: json.RawMessage(`{"command":"echo ` + key + `"}`), Output: key + "\n" + token}},
		MCP:       []agentproto.MCPStatus{{Name: "tracker", Transport: "http", Error: "MCP server tracker did not start: echoed " + token}}}
	out, _ := json.Marshal(resp)
	sb := &writingSandbox{scripted: &scripted{stdout: string(out), killed: make(chan struct{}), drained: make(chan struct{})}, errText: "log: token=" + token + "\n"}
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", KillGrace: 100 * time.Millisecond,
		Providers: []agentproto.Provider{{Name: "openai", Kind: "openai", Key: key}}}, EgressToken: token}
	res, err := isolation.Supervise(context.Background(), spec, func(_ context.Context, _ isolation.Spec, _ []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
		sb.out, sb.stderr = stdout, stderr
		return sb, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := json.Marshal(res)
	if strings.Contains(string(all), key) || strings.Contains(string(all), token) {
		t.Fatalf("a secret survived: %s", all)
	}
	if res.Response.Reply != "your key is [redacted]" || !strings.Contains(res.Stderr, "token=[redacted]") || !json.Valid(res.Response.ToolCalls[0].Args) {
		t.Fatalf("reply %q stderr %q args %s", res.Response.Reply, res.Stderr, res.Response.ToolCalls[0].Args)
	}
}
