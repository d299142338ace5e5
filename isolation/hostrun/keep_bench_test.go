package hostrun_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// BenchmarkKeptSandboxSecondRequest measures a request to a live kept
// landlock sandbox (started → finished, the local provider running
// "/sh true") beside the same request in a fresh host run per message, and
// the idle kept sandbox's memory.
//
//	go test -run '^$' -bench KeptSandbox -benchtime 100x ./isolation/hostrun/
func BenchmarkKeptSandboxSecondRequest(b *testing.B) {
	b.Run("kept", func(b *testing.B) {
		s := benchSpec(b)
		k, err := hostrun.Runner{}.Start(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		defer k.Stop(context.Background(), 0)
		if _, err := k.Run(context.Background(), benchRequest(0)); err != nil {
			b.Fatal(err)
		}
		durations := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			began := time.Now()
			if _, err := k.Run(context.Background(), benchRequest(i+1)); err != nil {
				b.Fatal(err)
			}
			durations = append(durations, time.Since(began))
		}
		b.StopTimer()
		reportPercentiles(b, durations)
		if mem, err := k.Memory(context.Background()); err == nil {
			b.ReportMetric(float64(mem)/(1<<20), "idle-MiB")
		}
	})
	b.Run("per-message", func(b *testing.B) {
		durations := make([]time.Duration, 0, b.N)
		for i := range b.N {
			s := benchSpec(b)
			s.RunID = "bench-msg-" + strconv.Itoa(i)
			s.Request = benchRequest(i)
			s.Request.RunID, s.Request.Version = s.RunID, agentproto.Version
			s.Request.Provider = agentproto.Provider{Name: "local", Kind: "local"}
			began := time.Now()
			if _, err := (hostrun.Runner{}).Run(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			durations = append(durations, time.Since(began))
		}
		reportPercentiles(b, durations)
	})
}

func benchSpec(b *testing.B) isolation.Spec {
	b.Helper()
	if berthAgentBuild != nil {
		b.Fatal(berthAgentBuild)
	}
	ws, err := os.MkdirTemp(base, "ws-bench-")
	if err == nil {
		err = os.Chmod(ws, 0o755)
	}
	if err == nil {
		err = os.Chown(ws, 65534, 65534)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(ws) })
	s := isolation.Spec{Plan: isolation.Plan{RunID: "bench-kept", AgentID: "a", Workspace: ws, AgentBinary: berthAgent, RunAs: "nobody",
		Timeout: 30 * time.Second, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9},
		Policy: isolation.HostPolicy(isolation.FileAccess{}, ws, nil)},
		Request: agentproto.Request{Version: agentproto.Version, RunID: "bench-kept", Provider: agentproto.Provider{Name: "local", Kind: "local"}}}
	return s
}

func benchRequest(i int) agentproto.Request {
	return agentproto.Request{RunID: "bench-" + strconv.Itoa(i), Agent: agentproto.Agent{ID: "a", MaxIterations: 2},
		Message: agentproto.Message{Text: "/sh true"}}
}

// reportPercentiles reports the p50 and p95 of durations in milliseconds.
func reportPercentiles(b *testing.B, durations []time.Duration) {
	if len(durations) == 0 {
		return
	}
	slices.Sort(durations)
	at := func(q float64) float64 {
		return float64(durations[int(q*float64(len(durations)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.95), "p95-ms")
}

// BenchmarkFiftyIdleKeptSandboxes opens 50 kept landlock sandboxes, each
// having served one request, and measures a request to a fresh host run
// per message while they are idle; it reports their memory together.
//
//	go test -run '^$' -bench FiftyIdle -benchtime 50x ./isolation/hostrun/
func BenchmarkFiftyIdleKeptSandboxes(b *testing.B) {
	const sandboxes = 50
	var total int64
	for i := range sandboxes {
		s := benchSpec(b)
		s.RunID = "bench-idle-" + strconv.Itoa(i)
		s.Request.RunID = s.RunID
		k, err := hostrun.Runner{}.Start(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = k.Stop(context.Background(), 0) })
		if _, err := k.Run(context.Background(), benchRequest(i)); err != nil {
			b.Fatal(err)
		}
		mem, err := k.Memory(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		total += mem
	}
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		s := benchSpec(b)
		s.RunID = "bench-beside-" + strconv.Itoa(i)
		s.Request = benchRequest(i)
		s.Request.RunID, s.Request.Version = s.RunID, agentproto.Version
		s.Request.Provider = agentproto.Provider{Name: "local", Kind: "local"}
		began := time.Now()
		if _, err := (hostrun.Runner{}).Run(context.Background(), s); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(began))
	}
	b.StopTimer()
	reportPercentiles(b, durations)
	b.ReportMetric(float64(total)/(1<<20), "idle-total-MiB")
	b.ReportMetric(float64(total)/sandboxes/(1<<20), "idle-each-MiB")
}
