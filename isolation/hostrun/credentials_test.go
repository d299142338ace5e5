package hostrun_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// credentialsRun compiles agent ops of a config whose connector's token is
// a file in a root-only credentials directory (install -d -m 0700
// /etc/berth/credentials, as the admin guide lays it out) and runs command
// through the real berth-agent as the agent's own uid (no passwd entry), the
// way the scheduler does. allowRead is the agent's file_access.allow_read.
func credentialsRun(t *testing.T, etc, token, command string, allowRead ...string) (isolation.Result, error) {
	t.Helper()
	state, err := os.MkdirTemp(base, "state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	const uid = 1879048192 + 3141 // from [scheduler] agent_uids, nameless
	ws := filepath.Join(state, "agents", "ops")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, uid, uid); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Providers:  config.Providers{Primary: "local", Entries: map[string]config.Provider{"local": {Name: "local", Kind: "local"}}},
		Agents:     []config.AgentSettings{{ID: "ops", FileAccess: config.FileAccessSettings{AllowRead: allowRead}}},
		Connectors: []config.Connector{{ID: "chat", Type: "meepachat", BaseURL: "https://chat.example.org", Token: token}},
		Scheduler:  config.Scheduler{AgentBinary: berthAgent, DefaultTimeout: time.Minute},
		Sources:    []string{filepath.Join(etc, "berth.toml")},
	}
	plan, err := runplan.Compile(cfg, "ops", "run-"+strings.ReplaceAll(t.Name(), "/", "-"), runplan.HostFacts{
		StateDir: state, ConfigDir: filepath.Join(etc, "berth.d"), RunUser: runplan.AgentUserFor(uid), AgentUser: true,
	})
	if err != nil {
		t.Fatalf("cannot compile the plan: %v", err)
	}
	if !strings.Contains(strings.Join(plan.Policy.Deny, " "), token) {
		t.Fatalf("the token file %s is not among the denied paths %q", token, plan.Policy.Deny)
	}
	s := isolation.Spec{Plan: plan, Request: agentproto.Request{
		Version: agentproto.Version, RunID: plan.RunID,
		Agent:   agentproto.Agent{ID: "ops", MaxIterations: 2},
		Message: agentproto.Message{ID: "m1", Text: "/sh " + command},
	}}
	return hostrun.Runner{}.Run(context.Background(), s)
}

// A connector token in a root-only directory is denied to every agent, and
// the agent (its own uid) cannot even look it up: that is the protection
// working, so the run goes ahead. The token stays unreadable, what else
// the agent may read beside it stays readable, and an allowed path it
// cannot reach still fails the run closed, saying why.
func TestARootOnlyCredentialsDirectoryDoesNotBreakTheRuns(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	if berthAgentBuild != nil {
		t.Fatalf("cannot build berth-agent: %v", berthAgentBuild)
	}
	// Under /etc as /etc/berth is: no mask of the run covers it (one would
	// bind back what the plan names there in directories of its own).
	etc, err := os.MkdirTemp("/etc", "berth-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	if err := os.Chmod(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	credentials := filepath.Join(etc, "credentials")
	if err := os.Mkdir(credentials, 0o700); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(credentials, "meepachat.token")
	if err := os.WriteFile(token, []byte("meepa-SECRET-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Readable by anyone but in a directory only root may search.
	readme := filepath.Join(credentials, "README")
	if err := os.WriteFile(readme, []byte("tokens live here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notes := filepath.Join(etc, "notes.txt")
	if err := os.WriteFile(notes, []byte("readable beside the credentials\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("A_run_goes_ahead_and_the_token_stays_out_of_reach", func(t *testing.T) {
		t.Parallel()
		res, err := credentialsRun(t, etc, token, "cat "+notes+"; cat "+token+" 2>&1 | sed 's/^/token: /'", etc)
		if err != nil {
			t.Fatalf("run failed: %v\nstderr: %s", err, res.Stderr)
		}
		reply := res.Response.Reply
		if !strings.Contains(reply, "readable beside the credentials") {
			t.Errorf("the file beside the credentials directory is not readable:\n%s", reply)
		}
		if got := lineOf(reply, "token: "); !strings.HasSuffix(got, "Permission denied") || strings.Contains(reply, "SECRET") {
			t.Errorf("the token: %q, want permission denied\nreply:\n%s", got, reply)
		}
	})
	t.Run("An_allowed_path_the_agent_cannot_reach_fails_the_run_closed", func(t *testing.T) {
		t.Parallel()
		res, err := credentialsRun(t, etc, token, "true", readme)
		if isolation.ReasonOf(err) != isolation.ReasonConfinement {
			t.Fatalf("got %v, want a confinement failure", err)
		}
		if !strings.Contains(string(res.Stderr), "cannot resolve allowed path") || !strings.Contains(string(res.Stderr), "permission denied") {
			t.Errorf("the agent does not say why: %s", res.Stderr)
		}
	})
}
