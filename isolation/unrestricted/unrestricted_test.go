package unrestricted_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/unrestricted"
)

var base, testAgent string

func TestMain(m *testing.M) {
	var err error
	if base, err = testenv.OpenDir("berth-unrestricted-"); err == nil {
		testAgent, err = testenv.Build(base, "testagent", "../hostrun/testdata/testagent")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(base)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(base)
	os.Exit(code)
}

const providerKey = "sk-unrestricted-KEY-must-not-leak"

func TestUnrestrictedBackendRunsUnconfinedAndWarnsOnEveryRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	var logs bytes.Buffer
	b := unrestricted.New(slog.New(slog.NewJSONHandler(&logs, nil)))
	if b.Name() != "unrestricted" {
		t.Errorf("name is %q", b.Name())
	}
	ws := t.TempDir()
	s := isolation.Spec{Plan: isolation.Plan{RunID: "r-unres", AgentID: "ops", Workspace: ws, AgentBinary: testAgent, RunAs: "root", Timeout: 30 * time.Second, Policy: agentproto.Policy{Unrestricted: true}, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9}}, Request: agentproto.Request{
		Version:  agentproto.Version,
		RunID:    "r-unres",
		Message:  agentproto.Message{Text: "whoami private words"},
		Provider: agentproto.Provider{Kind: "openai", Key: providerKey},
	}}
	res, err := b.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	var r struct {
		UID          int  `json:"uid"`
		Unrestricted bool `json:"unrestricted"`
	}
	if err := json.Unmarshal([]byte(res.Response.Reply), &r); err != nil {
		t.Fatalf("cannot decode reply %q: %v", res.Response.Reply, err)
	}
	if !r.Unrestricted || r.UID != 0 {
		t.Errorf("agent saw unrestricted=%v and ran as uid %d, want true and root", r.Unrestricted, r.UID)
	}
	out := logs.String()
	for _, want := range []string{`"level":"WARN"`, "UNRESTRICTED", `"agent":"ops"`, `"run_id":"r-unres"`, `"backend":"unrestricted"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s: %s", want, out)
		}
	}
	if strings.Contains(out, providerKey) || strings.Contains(out, "private words") {
		t.Errorf("log holds the request: %s", out)
	}
}

func TestUnrestrictedBackendRefusesAConfinedPlan(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	b := unrestricted.New(slog.New(slog.NewJSONHandler(&logs, nil)))
	s := isolation.Spec{Plan: isolation.Plan{RunID: "r-confined", AgentID: "ops", Workspace: t.TempDir(), AgentBinary: testAgent, RunAs: "root",
		Policy: agentproto.Policy{AllowRead: []string{"/usr"}}}}
	_, err := b.Run(context.Background(), s)
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "confined") {
		t.Fatalf("a confined plan gave %v, want a refusal to start", err)
	}
	if logs.Len() != 0 {
		t.Errorf("a refused run logged %s", logs.String())
	}
}
