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

	"github.com/berth-dev/berth/internal/testenv"

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

func TestUnrestrictedBackendForcesUnrestrictedAndWarnsOnEveryRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	var logs bytes.Buffer
	b := unrestricted.New(slog.New(slog.NewJSONHandler(&logs, nil)))
	if b.Name() != "unrestricted" {
		t.Errorf("name is %q", b.Name())
	}
	ws := t.TempDir()
	s := isolation.Spec{
		RunID:   "r-unres",
		AgentID: "ops",
		Request: agentproto.Request{
			Version:  agentproto.Version,
			RunID:    "r-unres",
			Message:  agentproto.Message{Text: "whoami private words"},
			Provider: agentproto.Provider{Kind: "openai", Key: providerKey},
			Policy:   agentproto.Policy{AllowRead: []string{"/usr"}},
		},
		Workspace:   ws,
		AgentBinary: testAgent,
		RunAs:       "root",
		Timeout:     30 * time.Second,
	}
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
	for _, want := range []string{`"level":"WARN"`, "UNRESTRICTED", `"agent":"ops"`, `"run":"r-unres"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s: %s", want, out)
		}
	}
	if strings.Contains(out, providerKey) || strings.Contains(out, "private words") {
		t.Errorf("log holds the request: %s", out)
	}
}
