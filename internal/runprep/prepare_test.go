package runprep

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

const preparedConfig = `
[scheduler]
run_as = "nobody"
agent_binary = "/nonexistent/berth-agent"

# These tests are about the preparation, not quotas (isolation/workspace).
[agent_defaults]
workspace_quota = "0"

[[agents]]
id = "host"

[[agents]]
id = "boxed"
[agents.container_mode]
enabled = true
`

func TestPrepareRefusesWhatCannotRunBeforeItMakesAnything(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		agent      string
		backends   map[string]isolation.Backend
		wantReason string
	}{
		{"An_unknown_agent_is_not_configured", "nobody", map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}}, isolation.ReasonAgentNotConfigured},
		{"A_host_agent_without_its_backend_has_no_backend", "host", map[string]isolation.Backend{"container": &recordingBackend{name: "container"}}, isolation.ReasonNoBackend},
		{"A_container_agent_without_an_engine_has_no_container_backend", "boxed", map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}}, isolation.ReasonContainerUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			db := uidDB(t)
			p := New(Options{StateDir: state, Backends: tc.backends, UIDs: db, Logger: quietLog, Getenv: func(string) string { return "" }})
			prep, err := p.Prepare(t.Context(), Input{Config: loadConfig(t, preparedConfig), Agent: tc.agent, RunID: "r1", Attempt: 1})
			if isolation.ReasonOf(err) != tc.wantReason {
				t.Fatalf("Prepare = %v, want reason %q", err, tc.wantReason)
			}
			if prep != nil {
				t.Fatalf("Prepare returned a run on backend %s for a run that has none", prep.Backend.Name())
			}
			if _, err := os.Stat(filepath.Join(state, "agents", tc.agent)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the refused run's workspace was made (%v)", err)
			}
		})
	}
}

func TestAPreparedRunHasItsWorkspaceItsUserAndASpecForItsBackend(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	db := uidDB(t)
	host := &recordingBackend{name: "landlock"}
	p := New(Options{StateDir: state, Backends: map[string]isolation.Backend{"landlock": host}, UIDs: db, Logger: quietLog, Getenv: func(string) string { return "" }})
	prep, err := p.Prepare(t.Context(), Input{Config: loadConfig(t, preparedConfig), Agent: "host", RunID: "r1", Attempt: 2})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer prep.Finish()
	if prep.Backend != host || prep.Agent.ID != "host" || prep.Plan.RunID != "r1" || prep.Plan.Attempt != 2 {
		t.Fatalf("prepared backend %s, agent %q, run %q attempt %d; want landlock, host, r1, 2", prep.Backend.Name(), prep.Agent.ID, prep.Plan.RunID, prep.Plan.Attempt)
	}
	ws := filepath.Join(state, "agents", "host")
	var st syscall.Stat_t
	if err := syscall.Stat(ws, &st); err != nil {
		t.Fatalf("the run's workspace: %v", err)
	}
	if st.Mode&0o7777 != 0o700 {
		t.Errorf("workspace mode %04o, want 0700", st.Mode&0o7777)
	}
	if os.Geteuid() == 0 {
		// A root scheduler runs each agent as its own uid, kept for good.
		uid, ok := storedUIDs(t, db)["host"]
		if !ok || prep.Plan.User == nil || prep.Plan.User.UID != uid || st.Uid != uid {
			t.Errorf("run user %+v, workspace owner %d, stored uid %d (%v); want the agent's own uid everywhere", prep.Plan.User, st.Uid, uid, ok)
		}
	}
	req := agentproto.Request{RunID: "r1"}
	started := false
	spec := prep.Spec(req, func(string) error { started = true; return nil })
	if spec.Plan.RunID != "r1" || spec.Request.RunID != "r1" || spec.OnStart == nil {
		t.Fatalf("spec = plan %q request %q; want both of r1 with its OnStart", spec.Plan.RunID, spec.Request.RunID)
	}
	if err := spec.OnStart("h"); err != nil || !started {
		t.Fatalf("the spec's OnStart is not the one given: %v", err)
	}
	if rec := prep.Finish(); len(rec.Decisions) != 0 || rec.Dropped != 0 {
		t.Errorf("a run without an egress proxy finished with decisions %+v", rec)
	}
}

func TestARefusedPlanStillNamesTheBackendItWouldHaveRunOn(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, `
[scheduler]
run_as = "nobody"
agent_binary = "/nonexistent/berth-agent"

[agent_defaults]
workspace_quota = "0"
provider = "openai"

[providers.openai]
api_key_env = "BERTH_TEST_NO_SUCH_KEY"

[[agents]]
id = "host"
`)
	host := &recordingBackend{name: "landlock"}
	p := New(Options{StateDir: t.TempDir(), Backends: map[string]isolation.Backend{"landlock": host}, UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	prep, err := p.Prepare(t.Context(), Input{Config: cfg, Agent: "host", RunID: "r1"})
	if err == nil || !strings.Contains(err.Error(), "BERTH_TEST_NO_SUCH_KEY") {
		t.Fatalf("Prepare = %v; want the refusal of a run whose provider key is missing", err)
	}
	if prep == nil || prep.Backend != host {
		t.Fatalf("Prepare = %v with %+v; want the landlock backend named beside the refusal", err, prep)
	}
}

func TestContainerPlansGetTheImageTheImageServiceGives(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		images     ImageEnsurer
		wantImage  string
		wantReason string
	}{
		{"The_tag_berth_imaged_gives_is_the_runs_image", fakeImages{tag: "berth-agent-boxed:abc"}, "berth-agent-boxed:abc", ""},
		{"A_failed_build_fails_the_run_saying_where", fakeImages{err: errors.New("step 3/5: jq not found")}, "", isolation.ReasonImageBuildFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			boxes := &recordingBackend{name: "container"}
			p := New(Options{StateDir: t.TempDir(), Backends: map[string]isolation.Backend{"container": boxes}, Images: tc.images, UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
			prep, err := p.Prepare(context.Background(), Input{Config: loadConfig(t, preparedConfig), Agent: "boxed", RunID: "r1"})
			if isolation.ReasonOf(err) != tc.wantReason {
				t.Fatalf("Prepare = %v, want reason %q", err, tc.wantReason)
			}
			if err != nil {
				if !errors.Is(err, tc.images.(fakeImages).err) || prep == nil || prep.Backend != boxes {
					t.Fatalf("Prepare = %v; want the build's error, on the container backend", err)
				}
				return
			}
			defer prep.Finish()
			if prep.Plan.Container.Image != tc.wantImage {
				t.Errorf("image %q, want %q", prep.Plan.Container.Image, tc.wantImage)
			}
		})
	}
}
