package intake

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/scheduler"
)

// instantBackend finishes every run at once with a reply.
type instantBackend struct{}

func (instantBackend) Name() string { return "landlock" }

func (instantBackend) Run(_ context.Context, spec isolation.Spec) (isolation.Result, error) {
	return isolation.Result{Response: agentproto.Response{Version: 1, RunID: spec.RunID, Reply: "done"}}, nil
}

func (instantBackend) Kill(context.Context, string) error { return nil }

// submitOnly hides a Submitter's SubmitBatch: the hand-off as it was
// before SubmitBatch, one Submit per message.
type submitOnly struct{ sub Submitter }

func (o submitOnly) Submit(ctx context.Context, msg busapi.Submission) (string, error) {
	return o.sub.Submit(ctx, msg)
}

// BenchmarkHandOffToTheScheduler: a backlog reaching the real
// berth-scheduler service (its store, its dispatcher with a backend that
// finishes at once) over a private system bus: one agent's 10,000 and 64
// agents' 10,000, each in batches (SubmitBatch) beside one Submit per
// message (pipelined across agents, one at a time within one), and one
// Submit at a time (the window set to 1) as the baseline of all.
func BenchmarkHandOffToTheScheduler(b *testing.B) {
	if _, err := exec.LookPath("dbus-daemon"); err != nil || os.Getuid() != 0 {
		b.Skip("needs root and dbus-daemon")
	}
	for _, tc := range []struct {
		name    string
		window  int
		backlog int
		agents  int
		batches bool
	}{
		{"serial", 1, 1000, 1, false},
		{"one-agent/submit", submitWindow, 1000, 1, false},
		{"one-agent/batched", submitWindow, 10000, 1, true},
		{"64-agents/submit", submitWindow, 10000, 64, false},
		{"64-agents/batched", submitWindow, 10000, 64, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var rates, perMsg []float64
			for range benchReps() {
				bus := testbus.Start(b, testbus.Options{})
				cfg := &config.Config{
					Agents: []config.AgentSettings{{ID: "ops-agent", WorkspaceQuota: new(config.Bytes)}, {ID: "helper", WorkspaceQuota: new(config.Bytes)}},
					Scheduler: config.Scheduler{
						MaxConcurrentRuns: 4,
						DefaultTimeout:    time.Minute,
						RunAs:             "nobody",
						AgentBinary:       "/nonexistent/berth-agent",
						AgentUIDs:         config.DefaultAgentUIDs,
					},
				}
				for i := range tc.agents {
					cfg.Agents = append(cfg.Agents, config.AgentSettings{ID: fmt.Sprintf("agent-%02d", i), WorkspaceQuota: new(config.Bytes)})
				}
				schedDir := b.TempDir()
				sched, err := scheduler.New(cfg, schedDir, scheduler.Options{
					Backends: map[string]isolation.Backend{"landlock": instantBackend{}},
					Getenv:   func(string) string { return "" },
					Logger:   quietLogger,
				})
				if err != nil {
					b.Fatal(err)
				}
				if err := sched.Export(bus.Conn(b)); err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				schedDone := make(chan error, 1)
				go func() { schedDone <- sched.Run(ctx) }()

				var sub Submitter = BusSubmitter{Conn: bus.Conn(b)}
				if !tc.batches {
					sub = submitOnly{sub}
				}
				s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger), WithSubmitter(sub))
				if err != nil {
					b.Fatal(err)
				}
				s.submitWindow = tc.window
				fillBacklogOf(b, s, tc.backlog, tc.agents)
				rate, commits := handOff(b, s, tc.backlog)
				s.Close()
				cancel()
				<-schedDone
				sched.Close()
				bus.Stop()
				rates = append(rates, rate)
				perMsg = append(perMsg, commits)
			}
			b.ReportMetric(median(rates), "msg/s")
			b.ReportMetric(median(perMsg), "commits/msg")
		})
	}
}
