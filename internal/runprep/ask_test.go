package runprep

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// The run's proxy gets the agent's ask rules: a request they hold is
// reported through Input.OnAsk and goes on once Prepared.Answer allows it.
func TestARunsAskedRequestGoesOnWhenPreparedAnswersIt(t *testing.T) {
	t.Parallel()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached "+r.URL.Path) }))
	t.Cleanup(site.Close)
	addr := site.Listener.Addr().String()
	cfg := loadConfig(t, fmt.Sprintf(`
[scheduler]
run_as = "nobody"
agent_binary = "/nonexistent/berth-agent"
egress_binary = %q
egress_user = "daemon"
allow_rlimit_fallback = true

[agent_defaults]
workspace_quota = "0"

[[agents]]
id = "host"
[agents.egress]
ask = [%q]
approval_timeout = "5m"
`, egressBinary(t), "GET "+addr))
	p := New(Options{StateDir: t.TempDir(), Backends: map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}},
		UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	asks := make(chan egresspolicy.Ask, 1)
	prep, err := p.Prepare(t.Context(), Input{Config: cfg, Agent: "host", RunID: "r1", Attempt: 1, OnAsk: func(a egresspolicy.Ask) { asks <- a }})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer prep.Finish()
	if e := prep.Plan.Egress; e == nil || len(e.Ask) != 1 || e.Ask[0].Raw != "GET "+addr || e.ApprovalTimeout != 5*time.Minute {
		t.Fatalf("egress plan = %+v, want the ask rule within 5m", prep.Plan.Egress)
	}
	conn, err := net.DialTimeout("unix", prep.Plan.Egress.Socket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET http://%s/pay HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", addr, addr, prep.Spec(agentproto.Request{RunID: "r1"}, nil).EgressToken)
	var ask egresspolicy.Ask
	select {
	case ask = <-asks:
	case <-time.After(15 * time.Second):
		t.Fatal("the run's proxy asked nothing")
	}
	if err := prep.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, By: "berthctl:root"}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "reached /pay" {
		t.Fatalf("got %s %q, want the site once approved", resp.Status, b)
	}
	prep.Finish()
	if err := prep.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true}); err == nil || !strings.Contains(err.Error(), "no egress proxy") {
		t.Fatalf("Answer after Finish = %v, want: the run has no egress proxy", err)
	}
	var none *Prepared
	if err := none.Answer(egresspolicy.Answer{ID: "x"}); err == nil {
		t.Fatal("Answer on no run succeeded")
	}
}
