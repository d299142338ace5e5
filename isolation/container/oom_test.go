package container_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// A kept sandbox's request whose tool the kernel OOM-killed is out of
// memory, as a one-shot run's is: the agent counts the kill in its
// response, which the engine may never report.
func TestAMemoryBombInAKeptContainerFailsTheRequestWithOutOfMemory(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b := newBackend(t, cli)
	k := startKept(t, b, spec(t, workspace(t), "", box{MemoryLimit: "64m"}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := k.Run(ctx, keptRequest(`/sh set -o pipefail; head -c 400000000 /dev/zero | tr '\0' x | sort | wc -c`))
	if isolation.ReasonOf(err) != isolation.ReasonOutOfMemory {
		t.Fatalf("memory bomb: %v; want reason %q\ntool calls %+v\nstderr: %s", err, isolation.ReasonOutOfMemory, res.Response.ToolCalls, res.Stderr)
	}
}
