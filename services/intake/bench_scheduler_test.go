package intake

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testbus"
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

// BenchmarkHandOffToTheScheduler: a backlog of 10,000 reaching the real
// berth-scheduler service (its store, its dispatcher with a backend that
// finishes at once) over a private system bus, pipelined beside one Submit
// at a time (on a smaller backlog).
func BenchmarkHandOffToTheScheduler(b *testing.B) {
	if _, err := exec.LookPath("dbus-daemon"); err != nil || os.Getuid() != 0 {
		b.Skip("needs root and dbus-daemon")
	}
	for _, tc := range []struct {
		name    string
		window  int
		backlog int
	}{
		{"serial", 1, 1000},
		{"pipelined", submitWindow, 10000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var rates, perMsg []float64
			for range benchReps() {
				bus := testbus.Start(b, testbus.Options{})
				cfg := &config.Config{
					Agents: []config.AgentSettings{{ID: "ops-agent"}, {ID: "helper"}},
					Scheduler: config.Scheduler{
						MaxConcurrentRuns: 4,
						DefaultTimeout:    time.Minute,
						RunAs:             "nobody",
						AgentBinary:       "/nonexistent/berth-agent",
					},
				}
				sched, err := scheduler.New(cfg, b.TempDir(), scheduler.Options{
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

				s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger), WithSubmitter(BusSubmitter{Conn: bus.Conn(b)}))
				if err != nil {
					b.Fatal(err)
				}
				s.submitWindow = tc.window
				fillBacklog(b, s, tc.backlog)
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
