package hostrun_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
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

// BenchmarkFiftyIdleAlternating measures fresh host runs per message in
// windows alone and beside 50 idle kept sandboxes, opened and stopped again
// in every cycle, in alternating order: a window right after 50 starts or
// 50 stops carries their after-effects, and a fixed order would charge them
// to one side. It fails if a kept sandbox's mounts still propagate to or
// from the host's (every new mount of a run would reach the 50).
//
//	go test -run '^$' -bench FiftyIdleAlternating -benchtime 1x ./isolation/hostrun/
func BenchmarkFiftyIdleAlternating(b *testing.B) {
	const sandboxes, cycles, perWindow = 50, 6, 30
	run := func(tag string) []time.Duration {
		var out []time.Duration
		for i := range perWindow {
			s := benchSpec(b)
			s.RunID = "bench-" + tag + "-" + strconv.Itoa(i)
			s.Request = benchRequest(i)
			s.Request.RunID, s.Request.Version = s.RunID, agentproto.Version
			s.Request.Provider = agentproto.Provider{Name: "local", Kind: "local"}
			began := time.Now()
			if _, err := (hostrun.Runner{}).Run(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			out = append(out, time.Since(began))
		}
		return out
	}
	open := func(cycle int) []isolation.Kept {
		var kept []isolation.Kept
		for i := range sandboxes {
			s := benchSpec(b)
			s.RunID = "bench-idle-" + strconv.Itoa(cycle) + "-" + strconv.Itoa(i)
			s.Request.RunID = s.RunID
			k, err := hostrun.Runner{}.Start(context.Background(), s)
			if err != nil {
				b.Fatal(err)
			}
			kept = append(kept, k)
			b.Cleanup(func() { _ = k.Stop(context.Background(), 0) })
			if _, err := k.Run(context.Background(), benchRequest(i)); err != nil {
				b.Fatal(err)
			}
		}
		requirePrivateMounts(b, kept[0])
		return kept
	}
	stop := func(kept []isolation.Kept) {
		for _, k := range kept {
			if err := k.Stop(context.Background(), 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	run("warm")
	var alone, beside []time.Duration
	b.ResetTimer()
	for cycle := range cycles {
		if cycle%2 == 0 {
			alone = append(alone, run("alone")...)
			kept := open(cycle)
			beside = append(beside, run("beside")...)
			stop(kept)
		} else {
			kept := open(cycle)
			beside = append(beside, run("beside")...)
			stop(kept)
			alone = append(alone, run("alone")...)
		}
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(alone), "alone-p50-ms")
	b.ReportMetric(p50(beside), "beside-50-p50-ms")
}

// requirePrivateMounts fails unless every mount of k's agent is private: no
// peer group (shared:) and no master (master:) in its mountinfo.
func requirePrivateMounts(b *testing.B, k isolation.Kept) {
	b.Helper()
	pid := strings.Split(k.Handle(), ":")[1]
	info, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		b.Fatalf("cannot read the kept sandbox's mounts: %v", err)
	}
	for line := range strings.Lines(string(info)) {
		if strings.Contains(line, " shared:") || strings.Contains(line, " master:") {
			b.Fatalf("a kept sandbox's mount propagates: %s", line)
		}
	}
}
