package runprep

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// keepingBackend is a recordingBackend that can keep sandboxes (it starts
// none: these tests are about what PrepareKept readies).
type keepingBackend struct{ recordingBackend }

func (*keepingBackend) Start(context.Context, isolation.Spec) (isolation.Kept, error) {
	return nil, fmt.Errorf("not started in this test")
}

func keptConfigText(t *testing.T) string {
	return fmt.Sprintf(`
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
allow = ["example.org:443"]
[agents.sandbox]
scope = "conversation"
`, egressBinary(t))
}

// refuse asks the proxy on socket for a host its rules do not name.
func refuse(t *testing.T, socket, token, host string) {
	t.Helper()
	conn, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		t.Fatalf("the sandbox's proxy does not answer on its socket: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\nProxy-Authorization: Bearer %s\r\n\r\n", host, host, token)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer from the proxy: %v", err)
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a host outside the rules got %s, want 403", resp.Status)
	}
}

// A kept sandbox's proxy lives until Finish, streams each decision as it is
// made (the sandbox's activity) and cuts its record per run.
func TestKeptProxyStreamsDecisionsAndCutsPerRun(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, keptConfigText(t))
	p := New(Options{StateDir: t.TempDir(), Backends: map[string]isolation.Backend{"landlock": &keepingBackend{recordingBackend{name: "landlock"}}},
		UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	seen := make(chan isolation.EgressDecision, 10)
	prep, err := p.PrepareKept(t.Context(), KeptInput{
		Input:    Input{Config: cfg, Agent: "host", RunID: "sbx1", Attempt: 1},
		Lifetime: time.Hour,
		OnEgress: func(d isolation.EgressDecision) { seen <- d },
	})
	if err != nil {
		t.Fatalf("PrepareKept: %v", err)
	}
	defer prep.Finish()
	if prep.Keeper == nil || prep.Plan.RunID != "sbx1" || prep.Plan.Egress == nil {
		t.Fatalf("PrepareKept = keeper %v, plan run %q, egress %v; want a keeper and the sandbox's plan with egress", prep.Keeper, prep.Plan.RunID, prep.Plan.Egress)
	}
	spec := prep.OpeningSpec(agentproto.Agent{ID: "host"}, nil)
	if spec.RunID != "sbx1" || spec.Request.RunID != "sbx1" || spec.EgressToken == "" {
		t.Fatalf("opening spec: run %q, request %q, token set %v", spec.RunID, spec.Request.RunID, spec.EgressToken != "")
	}
	for i, host := range []string{"first.example", "second.example"} {
		refuse(t, prep.Plan.Egress.Socket, spec.EgressToken, host)
		select {
		case d := <-seen:
			if d.Host != host || d.Allowed {
				t.Errorf("decision streamed: %+v, want the refusal of %s", d, host)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the decision of request %d was not streamed", i+1)
		}
		// Each run's record holds its own decisions only; a decision is in
		// the record before it is streamed.
		rec := prep.CutEgress()
		if len(rec.Decisions) != 1 || rec.Decisions[0].Host != host || rec.Counts.Refused != 1 {
			t.Errorf("cut %d = %+v; want the one refusal of %s", i+1, rec, host)
		}
	}
	prep.Finish()
	if _, err := os.Stat(filepath.Dir(prep.Plan.Egress.Socket)); !os.IsNotExist(err) {
		t.Errorf("the sandbox's egress directory outlived Finish: %v", err)
	}
}

func TestABackendThatCannotKeepASandboxIsRefusedAndNothingIsLeft(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, keptConfigText(t))
	state := t.TempDir()
	p := New(Options{StateDir: state, Backends: map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}},
		UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	prep, err := p.PrepareKept(t.Context(), KeptInput{Input: Input{Config: cfg, Agent: "host", RunID: "sbx2", Attempt: 1}, Lifetime: time.Hour})
	if isolation.ReasonOf(err) != isolation.ReasonNoBackend || prep == nil || prep.Backend.Name() != "landlock" {
		t.Fatalf("PrepareKept on a backend that cannot keep = %v, %v; want %s naming the backend", prep, err, isolation.ReasonNoBackend)
	}
	if _, err := os.Stat(filepath.Join(state, "egress", isolation.AttemptName("sbx2", 1))); !os.IsNotExist(err) {
		t.Errorf("the refused sandbox's egress directory is left: %v", err)
	}
}
