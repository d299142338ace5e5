package isolation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// loggingSandbox writes log to the agent's stderr in pieces of piece bytes
// (a backend's copier splits lines anywhere), then its response, and exits.
type loggingSandbox struct {
	log, response string
	piece         int
	stdout        io.Writer
	stderr        io.Writer
	drained       chan struct{}
	once          sync.Once
}

func (s *loggingSandbox) Handle() string { return "logging:1" }
func (s *loggingSandbox) Wait(context.Context) (isolation.Exit, error) {
	for rest := s.log; len(rest) > 0; {
		n := min(s.piece, len(rest))
		io.WriteString(s.stderr, rest[:n])
		rest = rest[n:]
	}
	io.WriteString(s.stdout, s.response)
	s.Release()
	return isolation.Exit{}, nil
}
func (s *loggingSandbox) Kill(context.Context) error         { return nil }
func (s *loggingSandbox) Drained() <-chan struct{}           { return s.drained }
func (s *loggingSandbox) Inspect(context.Context, bool) bool { return false }
func (s *loggingSandbox) Release()                           { s.once.Do(func() { close(s.drained) }) }

func progressLine(seq int, tool, text string) string {
	p, _ := json.Marshal(agentproto.Progress{Seq: seq, Tool: tool, Text: text})
	return `{"time":"2026-12-02T08:00:00Z","level":"INFO","msg":"progress","run_id":"r1","progress":` + string(p) + "}\n"
}

func superviseLog(t *testing.T, log string, piece int, spec isolation.Spec) ([]agentproto.Progress, isolation.Result) {
	t.Helper()
	var mu sync.Mutex
	var got []agentproto.Progress
	ctx := isolation.WithProgress(context.Background(), func(p agentproto.Progress) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	start := func(_ context.Context, _ isolation.Spec, _ []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
		return &loggingSandbox{log: log, piece: piece, response: `{"version":1,"run_id":"r1","reply":"done"}` + "\n",
			stdout: stdout, stderr: stderr, drained: make(chan struct{})}, nil
	}
	spec.Plan.RunID = "r1"
	spec.Request = agentproto.Request{Version: agentproto.Version}
	res, err := isolation.Supervise(ctx, spec, start)
	if err != nil {
		t.Fatalf("Supervise: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return got, res
}

func TestProgress_lines_of_the_agents_log_reach_the_callback_in_order(t *testing.T) {
	t.Parallel()
	log := `{"level":"INFO","msg":"tool call","tool":"shell"}` + "\n" +
		progressLine(1, "shell", "running `pytest`") +
		`{"level":"INFO","msg":"progressive but not progress"}` + "\n" +
		progressLine(2, "web_fetch", "fetching pypi.org") +
		progressLine(2, "web_fetch", "a repeated seq is dropped") +
		progressLine(1, "shell", "an older seq is dropped")
	for _, piece := range []int{1, 7, len(log)} {
		t.Run(fmt.Sprintf("In_writes_of_%d_bytes", piece), func(t *testing.T) {
			t.Parallel()
			got, res := superviseLog(t, log, piece, isolation.Spec{})
			want := []agentproto.Progress{{Seq: 1, Tool: "shell", Text: "running `pytest`"}, {Seq: 2, Tool: "web_fetch", Text: "fetching pypi.org"}}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("progress = %v, want %v", got, want)
			}
			if res.Response.Reply != "done" || strings.Contains(res.Response.Reply, "pytest") {
				t.Fatalf("reply = %q: progress must never mix with the response", res.Response.Reply)
			}
		})
	}
}

func TestProgress_from_a_hostile_agent_is_capped_cleaned_and_redacted(t *testing.T) {
	t.Parallel()
	const key = "sk-provider-key-0123456789"
	const secret = "ghp_egresssecret0123456789"
	var log strings.Builder
	log.WriteString(progressLine(1, "shell", "running `curl -H "+key+"`"))
	log.WriteString(progressLine(2, "shell", "token "+secret+" and the egress one"))
	log.WriteString(progressLine(3, "shell\nforged", "line one\nline two\u202e\x00"))
	log.WriteString(progressLine(4, "shell", strings.Repeat("€", 500)))
	// A line over MaxProgressLine is not parsed at all.
	log.WriteString(progressLine(5, "shell", strings.Repeat("x", agentproto.MaxProgressLine)))
	for seq := 6; seq < agentproto.MaxProgressEvents+50; seq++ {
		log.WriteString(progressLine(seq, "shell", "flood"))
	}
	spec := isolation.Spec{EgressToken: "egress-token-0123456789"}
	spec.Plan.Providers = []agentproto.Provider{{Name: "main", Key: key}}
	spec.Plan.Egress = &isolation.EgressPlan{Secrets: []isolation.EgressSecret{{Value: secret}}}
	got, _ := superviseLog(t, log.String(), 4096, spec)

	if len(got) != agentproto.MaxProgressEvents-1 { // seq 5 was too long
		t.Fatalf("%d events passed on, want %d (the cap, less the overlong line)", len(got), agentproto.MaxProgressEvents-1)
	}
	for _, p := range got {
		if strings.Contains(p.Text, key) || strings.Contains(p.Text, secret) {
			t.Fatalf("event %d shows a secret: %q", p.Seq, p.Text)
		}
		if len(p.Text) > agentproto.MaxProgressText || !utf8.ValidString(p.Text) || strings.ContainsAny(p.Text+p.Tool, "\n\x00\u202e") {
			t.Fatalf("event %d is not clean or over the cap: %q (%d bytes)", p.Seq, p.Text, len(p.Text))
		}
		if p.Seq == 5 {
			t.Fatalf("the overlong line was passed on")
		}
	}
	if !strings.Contains(got[0].Text, isolation.Redacted) || !strings.Contains(got[1].Text, isolation.Redacted) {
		t.Fatalf("secrets are not shown as %s: %q, %q", isolation.Redacted, got[0].Text, got[1].Text)
	}
}
