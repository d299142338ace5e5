package ctl

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// golden compares got with testdata/golden/name, or rewrites it with
// -update: a change of berthctl's wording is a reviewed diff.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read golden file (run go test -update once): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// at is a fixed instant; berthctl prints times in the local zone, so the
// tests that print one read it in UTC.
var at = time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	time.Local = time.UTC
	os.Exit(m.Run())
}

func TestOutputMatchesTheGoldenFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"runs_list.txt", func(w *bytes.Buffer) error {
			return writeRunList(w, []busapi.RunSummary{
				{RunHead: busapi.RunHead{ID: "20261201T093000_1_aa", Agent: "alpha", State: busapi.StateSucceeded, CreatedAt: at}, TextPreview: "deploy the\nthing, please, and tell me when it is done"},
				{RunHead: busapi.RunHead{ID: "20261201T092900_1_bb", Agent: "beta", State: busapi.StateFailed, Reason: "timeout", CreatedAt: at.Add(-time.Minute)}, TextPreview: "hi"},
				{RunHead: busapi.RunHead{ID: "20261201T090000_1_cc", Agent: "alpha", State: busapi.StateSucceeded, CreatedAt: at.Add(-30 * time.Minute), Schedule: "standup"}, TextPreview: "Summarise yesterday"},
			})
		}},
		{"runs_show.txt", func(w *bytes.Buffer) error {
			printRun(w, busapi.Run{
				RunHead: busapi.RunHead{ID: "20261201T093000_1_aa", MessageID: "hooks/m-1", Agent: "alpha", State: busapi.StateFailed, Reason: "egress refused",
					Connector: "hooks", Channel: "ops", Author: "ann", Attempts: 1, Backend: "landlock",
					CreatedAt: at, StartedAt: at.Add(time.Second), FinishedAt: at.Add(3 * time.Second), Delivered: true},
				Text:          busapi.Output{Text: "fetch the page"},
				Reply:         busapi.Output{Text: "I could not reach it."},
				Error:         busapi.Output{Text: "the proxy refused example.org"},
				ToolCalls:     busapi.Output{Text: `[{"name":"fetch","args":{"url":"https://example.org/"},"error":"403"}]`},
				Egress:        busapi.Output{Text: `[{"time":"2026-12-01T09:30:02Z","method":"CONNECT","host":"example.org","port":443,"allowed":false,"reason":"no rule allows example.org"}]`},
				EgressCounts:  busapi.Output{Text: `{"allowed":0,"refused":1,"hosts":[{"host":"example.org","allowed":0,"refused":1}],"other_hosts":{"allowed":0,"refused":0}}`},
				EgressDropped: 0,
				MCP:           busapi.Output{Text: `[{"name":"files","transport":"stdio","tools":["mcp__files__read","mcp__files__list"]},{"name":"tracker","transport":"http","tools":["mcp__tracker__get_issue"],"error":"MCP server tracker did not start: 401 Unauthorized"}]`},
			})
			return nil
		}},
		{"sandbox_explain.txt", func(w *bytes.Buffer) error {
			data, err := os.ReadFile(filepath.Join("testdata", "sandbox_explain.json"))
			if err != nil {
				return err
			}
			e, err := busapi.ExplanationFromWire(string(data))
			if err != nil {
				return err
			}
			explain(w, e)
			return nil
		}},
		{"egress_explain_allowed.txt", func(w *bytes.Buffer) error {
			explainEgress(w, busapi.EgressVerdict{Method: "CONNECT", URL: "https://api.example.com/v1", Allowed: true, Rule: "api.example.com:443", Reason: "allowed by rule api.example.com:443", Agent: "alpha", Network: "none (egress proxy)"})
			return nil
		}},
		{"egress_explain_refused.txt", func(w *bytes.Buffer) error {
			explainEgress(w, busapi.EgressVerdict{Method: "GET", URL: "http://169.254.169.254/latest", Reason: "169.254.169.254 is a link-local address", Note: "no rule can allow it", Agent: "alpha", Network: "none (egress proxy)"})
			return nil
		}},
		{"container_images.txt", func(w *bytes.Buffer) error {
			return writeImages(w, []busapi.Image{
				{Tag: "berth-isolated:1.2.0-abc", Kind: "isolated", Status: "ready", Present: true, Size: 48 << 20, LastUsed: "2026-12-01T09:00:00Z", Agents: []string{"alpha", "beta"}},
				{Tag: "berth-sandbox:def", Kind: "sandbox", Status: "ready", Present: false},
				{Tag: "berth-sandbox:0ff", Kind: "sandbox", Status: "failed", Error: "step 3 failed\nmore", LogTail: []string{"E: Unable to locate package nope"}},
			})
		}},
		{"container_images_none.txt", func(w *bytes.Buffer) error { return writeImages(w, nil) }},
		{"status_connectors.txt", func(w *bytes.Buffer) error {
			return writeConnectors(w, []busapi.ConnectorStatus{
				{ID: "chat", Type: "meepachat", State: "connected", ConnectedSince: "2026-12-01T09:00:00Z", Reconnects: 2, Progress: "typing", Reactions: "on"},
				{ID: "sl", Type: "slack", State: "connected", ConnectedSince: "2026-12-01T09:00:00Z", Progress: "edit", Reactions: "refused, none added until intake restarts: the bot lacks the bot scope reactions:write: Slack answered missing_scope"},
				{ID: "dc", Type: "discord", State: "disconnected", LastError: "gateway closed\n4004", LastErrorAt: "2026-12-01T09:05:00Z", Warning: "MESSAGE_CONTENT intent not granted", Reconnects: 7},
				{ID: "hooks", Type: "webhook", State: "http"},
			})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			if err := tc.write(&out); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, out.Bytes())
		})
	}
}

func TestStatusMatchesTheGoldenFile(t *testing.T) {
	t.Parallel()
	c, s, out, _ := runsSchedulerOnBus(t, t.TempDir())
	if _, err := s.Submit(busapi.Submission{MessageID: "m1", Agent: "alpha", Text: "queued, for no backend runs it"}); err != nil {
		t.Fatal(err)
	}
	// Only the scheduler is on this bus: intake and imaged are not running.
	if err := c.status(nil); err != nil {
		t.Fatalf("status: %v", err)
	}
	golden(t, "status.txt", out.Bytes())
}
