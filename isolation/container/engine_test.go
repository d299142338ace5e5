package container_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// hungEngine is a Docker socket that accepts connections and never answers.
func hungEngine(t *testing.T) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	cli, err := client.New(client.WithHost("unix://"+sock), client.WithAPIVersionNegotiation())
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
				Network: isolation.Network{Mode: "none"}, Timeout: time.Minute}}
			_, err := b.Run(context.Background(), s)
			if isolation.ReasonOf(err) != container.ReasonEngine {
				t.Errorf("reason %q, want %q", isolation.ReasonOf(err), container.ReasonEngine)
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
