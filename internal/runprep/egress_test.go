package runprep

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// egressBinary builds berth-egress into a directory every user can enter
// (the proxy runs as [scheduler] egress_user).
func egressBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "berth-runprep-egress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := testenv.BuildStatic(dir, "berth-egress", "../../cmd/berth-egress")
	if err != nil {
		t.Fatalf("cannot build berth-egress: %v", err)
	}
	return bin
}

func TestARunThatNeedsAWayOutGetsItsOwnProxyUntilFinish(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
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
allow = ["example.org:443"]
`, egressBinary(t)))
	p := New(Options{StateDir: state, Backends: map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}},
		UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	prep, err := p.Prepare(t.Context(), Input{Config: cfg, Agent: "host", RunID: "r1", Attempt: 1})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer prep.Finish()
	if prep.Plan.Egress == nil {
		t.Fatal("a run with egress rules has no egress plan")
	}
	spec := prep.Spec(agentproto.Request{RunID: "r1"}, nil)
	if spec.EgressToken == "" {
		t.Fatal("the spec carries no token for the run's proxy")
	}
	// A request for a host the rules do not name, with the run's token: the
	// proxy refuses it, and says so in the record Finish returns.
	conn, err := net.DialTimeout("unix", prep.Plan.Egress.Socket, 10*time.Second)
	if err != nil {
		t.Fatalf("the run's proxy does not answer on its socket: %v", err)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "CONNECT refused.example:443 HTTP/1.1\r\nHost: refused.example:443\r\nProxy-Authorization: Bearer %s\r\n\r\n", spec.EgressToken)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer from the proxy: %v", err)
	}
	conn.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a host outside the rules got %s, want 403", resp.Status)
	}
	rec := prep.Finish()
	if rec.Counts.Refused != 1 || len(rec.Decisions) != 1 || rec.Decisions[0].Host != "refused.example" {
		t.Errorf("Finish returned %+v; want the one refusal", rec)
	}
	if _, err := os.Stat(filepath.Dir(prep.Plan.Egress.Socket)); !os.IsNotExist(err) {
		t.Errorf("the run's egress directory outlived its proxy: %v", err)
	}
	if rec := prep.Finish(); len(rec.Decisions) != 0 {
		t.Errorf("a second Finish returned decisions again: %+v", rec)
	}
}
