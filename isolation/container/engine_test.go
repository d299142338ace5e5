package container_test

import (
	"context"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// hungEngine is a client of a Docker socket that accepts connections and
// never answers.
func hungEngine(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.New(client.WithHost(testdocker.HungEngine(t)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// Every engine call has a deadline: against an engine that never answers,
// runs, kills and sweeps end with an error in about that time.
func TestAnEngineThatNeverAnswersFailsEveryCallWithinItsDeadline(t *testing.T) {
	t.Parallel()
	const deadline = time.Second
	b, err := container.New(container.Options{Client: hungEngine(t), Instance: t.TempDir(), EngineTimeout: deadline})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"A_run_fails_with_engine_unavailable", func() error {
			s := isolation.Spec{Plan: isolation.Plan{RunID: "r1", AgentID: "a", Workspace: t.TempDir(), RunAs: "nobody", AgentBinary: "/bin/true",
				Network: isolation.Network{Mode: "none"}, Timeout: time.Minute, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9, TmpfsBytes: 256 << 20}}}
			_, err := b.Run(context.Background(), s)
			if isolation.ReasonOf(err) != isolation.ReasonEngineUnavailable {
				t.Errorf("reason %q, want %q", isolation.ReasonOf(err), isolation.ReasonEngineUnavailable)
			}
			return err
		}, "did not answer within 1s"},
		{"Kill_of_an_orphan_fails", func() error { return b.Kill(context.Background(), "container:abc") }, "deadline exceeded"},
		{"A_sweep_fails", func() error { _, err := b.Sweep(context.Background(), nil); return err }, "deadline exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if took := time.Since(began); took > 5*deadline {
				t.Errorf("took %s against a deadline of %s", took, deadline)
			}
		})
	}
}
