package container_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation/container"
)

func TestAContainerRemovedInTheBackgroundIsGoneOnceTheBackendIsDrained(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	b, err := container.New(container.Options{Client: cli, Instance: instance(t), RemoveInBackground: true})
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, workspace(t), "/sh echo removed later", box{})
	if reply := mustRun(t, b, s); !strings.Contains(reply, "removed later") {
		t.Fatalf("reply %q, want the command's output", reply)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if n := containersOf(t, cli, s.RunID); n != 0 {
		t.Fatalf("%d containers of run %s left after Drain, want the background removal done", n, s.RunID)
	}
}
