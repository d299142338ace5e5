package container_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// A run queued again after a crash keeps its id: the first attempt's
// container must go while the second attempt's stays.
func TestSweepRemovesADeadAttemptsContainerAndKeepsTheLiveAttempts(t *testing.T) {
	t.Parallel()
	cli := engine(t)
	crashed := newBackend(t, cli)
	first := spec(t, workspace(t), "/sh sleep 120", box{})
	first.Attempt = 1
	firstDone := startHeld(t, crashed, first)

	restarted := newBackend(t, cli) // same instance, as after a restart
	second := first
	second.Attempt = 2
	secondDone := startHeld(t, restarted, second)

	byAttempt := attemptsOf(t, cli, first.RunID)
	if len(byAttempt) != 2 || !strings.Contains(byAttempt["1"], isolation.AttemptName(first.RunID, 1)) || !strings.Contains(byAttempt["2"], isolation.AttemptName(first.RunID, 2)) {
		t.Fatalf("containers of run %s by berth.attempt: %v; want attempts 1 and 2, each named with its attempt", first.RunID, byAttempt)
	}
	live := func(run string, attempt int) bool { return run == first.RunID && attempt == 2 }
	removed, err := restarted.Sweep(context.Background(), live)
	if err != nil || len(removed) != 1 || removed[0] != first.RunID {
		t.Fatalf("sweep removed %v (%v); want run %s once", removed, err, first.RunID)
	}
	if left := attemptsOf(t, cli, first.RunID); len(left) != 1 || left["2"] == "" {
		t.Fatalf("containers left by berth.attempt: %v; want only the live attempt's", left)
	}
	if err := waitErr(t, firstDone); err == nil {
		t.Fatal("the dead attempt's run succeeded after its container was swept")
	}
	select {
	case err := <-secondDone:
		t.Fatalf("the live attempt ended when the dead one was swept: %v", err)
	default:
	}
	if removed, err := restarted.Sweep(context.Background(), nil); err != nil || len(removed) != 1 {
		t.Fatalf("sweep with no live attempt removed %v (%v); want the second attempt's", removed, err)
	}
	_ = waitErr(t, secondDone)
	if n := containersOf(t, cli, first.RunID); n != 0 {
		t.Fatalf("%d containers of the run left behind", n)
	}
}

// startHeld starts s on b and returns once its container runs; the channel
// gets the run's error when it ends.
func startHeld(t *testing.T, b *container.Backend, s isolation.Spec) <-chan error {
	t.Helper()
	started := make(chan struct{})
	s.OnStart = func(string) error { close(started); return nil }
	done := make(chan error, 1)
	go func() { _, err := run(t, b, s); done <- err }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("attempt %d ended before it started: %v", s.Attempt, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("attempt %d did not start within 2 minutes", s.Attempt)
	}
	return done
}

// waitErr is the error of a run that ends within a minute.
func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the run did not end within a minute of its container's removal")
		return nil
	}
}

// attemptsOf maps the berth.attempt of run's containers to their names.
func attemptsOf(t *testing.T, cli *client.Client, run string) map[string]string {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", container.LabelRun+"="+run)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range list.Items {
		out[c.Labels[container.LabelAttempt]] = strings.Join(c.Names, ",")
	}
	return out
}
