package container_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// How a run ends with container.Options.RemoveInBackground (what
// berth-scheduler sets): answered as soon as the agent's response is
// complete, the container killed, waited for and removed afterwards.

// records keeps the messages a backend logs.
type records struct {
	mu    sync.Mutex
	lines []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Level.String() + " " + rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += " " + a.Key + "=" + a.Value.String()
		return true
	})
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	return nil
}

// count is how many lines contain all of words.
func (r *records) count(words ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.lines {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

func (r *records) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

// endingLater is a backend that ends its runs' containers in the
// background, with what it logs.
func endingLater(t *testing.T) (*container.Backend, *records) {
	t.Helper()
	log := &records{}
	b, err := container.New(container.Options{Client: engine(t), Instance: instance(t), RemoveInBackground: true, Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	drainOnCleanup(t, b) // also when the test fails before its own drain
	return b, log
}

func drain(t *testing.T, b *container.Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// answerer is a stand-in for berth-agent (testdata/answerer) that answers
// and hangs, or writes a line that is no response.
var answerer = sync.OnceValues(func() (string, error) {
	return testenv.BuildStatic(binDir, "answerer", "./testdata/answerer")
})

// waitPool waits until the pool of agent "tester" holds n containers a run
// can take (running in the engine is not yet taken into the pool).
func waitPool(t *testing.T, b *container.Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for b.PoolSize("tester") < n {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not reach %d containers within 2 minutes", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAWarmRunIsAnsweredBeforeItsContainerEndsAndDrainRemovesIt(t *testing.T) {
	t.Parallel()
	b, log := endingLater(t)
	cli := b.Client()
	ws := workspace(t)
	warm := box{Warm: 1}
	b.Warm([]isolation.Spec{spec(t, ws, "", warm)})
	member := waitWarm(t, cli, "one warm container", count(1))[0]
	waitPool(t, b, 1)

	s := spec(t, ws, "/sh echo answered early", warm)
	var handle string
	s.OnStart = func(h string) error { handle = h; return nil }
	res, err := run(t, b, s)
	if err != nil || !strings.Contains(res.Response.Reply, "answered early") || res.ExitCode != 0 {
		t.Fatalf("warm run: %+v, %v; want the reply with exit code 0", res, err)
	}
	// Answered before the exit, with the agent's whole log all the same.
	for _, line := range []string{"confined with Landlock", "tool call", isolation.ResponseFollows} {
		if !strings.Contains(res.Stderr, `"msg":"`+line+`"`) {
			t.Errorf("stderr tail lacks the agent's %q line:\n%s", line, res.Stderr)
		}
	}
	if handle != "container:"+member.ID {
		t.Fatalf("run used %s, want the warm container %s", handle, member.ID)
	}
	drain(t, b)
	if exists(t, cli, member.ID) {
		t.Fatal("the warm container that served the run is still there after Drain")
	}
	// The run returned on its answer: its container's end was handed to
	// the backend, which ended it cleanly.
	if log.count("container of an answered run ended", "run_id="+s.RunID) != 1 || log.count("WARN") != 0 {
		t.Fatalf("want the answered run's container ended in the background, cleanly; the backend logged:\n%s", log)
	}
}

func TestAnOOMKilledToolStillFailsAWarmRunWithOutOfMemory(t *testing.T) {
	t.Parallel()
	b, _ := endingLater(t)
	cli := b.Client()
	ws := workspace(t)
	warm := box{Warm: 1, MemoryLimit: "64m"}
	b.Warm([]isolation.Spec{spec(t, ws, "", warm)})
	member := waitWarm(t, cli, "one warm container", count(1))[0]
	waitPool(t, b, 1)
	s := spec(t, ws, `/sh set -o pipefail; head -c 400000000 /dev/zero | tr '\0' x | sort | wc -c`, warm)
	_, err := run(t, b, s)
	if isolation.ReasonOf(err) != isolation.ReasonOutOfMemory {
		t.Fatalf("memory bomb in a warm container: %v; want reason %q", err, isolation.ReasonOutOfMemory)
	}
	drain(t, b)
	if exists(t, cli, member.ID) {
		t.Fatal("the OOM-killed run's container is still there after Drain")
	}
}

func TestARunThatDoesNotAnswerRightEndsAsBefore(t *testing.T) {
	t.Parallel()
	bin, err := answerer()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, text string
		reply      string // the run succeeds with it
		reason     string // the run fails with it
	}{
		{"An_agent_that_hangs_after_answering_is_killed_and_the_run_has_its_reply", "hang", "answered, now hanging", ""},
		{"A_line_that_is_no_response_is_a_bad_response", "garbage", "", isolation.ReasonBadResponse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, log := endingLater(t)
			s := spec(t, workspace(t), tc.text, box{})
			s.AgentBinary = bin
			s.Timeout = 2 * time.Minute // a hang the supervisor waited for would fail with "timeout"
			res, err := run(t, b, s)
			if isolation.ReasonOf(err) != tc.reason || res.Response.Reply != tc.reply {
				t.Fatalf("run: %q, %v; want reply %q, reason %q", res.Response.Reply, err, tc.reply, tc.reason)
			}
			drain(t, b)
			if n := containersOf(t, b.Client(), s.RunID); n != 0 {
				t.Fatalf("%d containers of run %s left after Drain", n, s.RunID)
			}
			if log.count("WARN") != 0 {
				t.Fatalf("the backend warned:\n%s", log)
			}
		})
	}
}

func TestASweepDoesNotTakeTheContainerOfAnAnsweredRunForAnOrphan(t *testing.T) {
	t.Parallel()
	bin, err := answerer()
	if err != nil {
		t.Fatal(err)
	}
	b, log := endingLater(t)
	s := spec(t, workspace(t), "hang", box{})
	s.AgentBinary = bin
	if _, err := run(t, b, s); err != nil {
		t.Fatalf("run: %v", err)
	}
	// Right after the reply its container is still being killed (the
	// engine takes tens of milliseconds): it is this process's to end.
	removed, err := b.Sweep(context.Background(), nil)
	if err != nil || len(removed) != 0 {
		t.Fatalf("sweep right after the reply removed runs %v (%v); want none: the run's own teardown ends it", removed, err)
	}
	drain(t, b)
	if n := containersOf(t, b.Client(), s.RunID); n != 0 || log.count("WARN") != 0 {
		t.Fatalf("%d containers left after Drain; the backend logged:\n%s", n, log)
	}
}
