package container_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation/container"
)

// BenchmarkKeptContainerSecondRequest measures a request to a live kept
// container (started → finished, the local provider running "/sh true")
// beside the same request in a fresh container per message, and the idle
// kept container's memory as the engine reports it.
//
//	go test -run '^$' -bench KeptContainer -benchtime 50x ./isolation/container/
func BenchmarkKeptContainerSecondRequest(b *testing.B) {
	// spec needs a *testing.T only to refuse a bad memory limit; box{} has none.
	var t *testing.T
	testenv.NeedRoot(b)
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	cli := testdocker.Engine(b)
	b.Run("kept", func(b *testing.B) {
		bk, err := container.New(container.Options{Client: cli, Instance: b.Name() + "@" + runToken})
		if err != nil {
			b.Fatal(err)
		}
		s := spec(t, benchWorkspace(b), "", box{})
		ctx := context.Background()
		k, err := bk.Start(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		defer k.Stop(ctx, 0)
		if _, err := k.Run(ctx, keptRequest("/sh true")); err != nil {
			b.Fatal(err)
		}
		durations := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			began := time.Now()
			if _, err := k.Run(ctx, keptRequest("/sh true")); err != nil {
				b.Fatal(err)
			}
			durations = append(durations, time.Since(began))
		}
		b.StopTimer()
		report(b, durations)
		if mem, err := k.Memory(ctx); err == nil {
			b.ReportMetric(float64(mem)/(1<<20), "idle-MiB")
		}
	})
	b.Run("per-message", func(b *testing.B) {
		bk, err := container.New(container.Options{Client: cli, Instance: b.Name() + "@" + runToken})
		if err != nil {
			b.Fatal(err)
		}
		ws := benchWorkspace(b)
		durations := make([]time.Duration, 0, b.N)
		for range b.N {
			s := spec(t, ws, "/sh true", box{})
			began := time.Now()
			if _, err := bk.Run(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			durations = append(durations, time.Since(began))
		}
		report(b, durations)
	})
}

// benchWorkspace is a directory the agent user (nobody) owns.
func benchWorkspace(b *testing.B) string {
	b.Helper()
	ws := filepath.Join(b.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.Chown(ws, 65534, 65534); err != nil {
		b.Fatal(err)
	}
	return ws
}

func report(b *testing.B, durations []time.Duration) {
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
