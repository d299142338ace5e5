package scheduler

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/fulldisk"
)

type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitLog waits until the log holds line.
func (b *logBuffer) waitLog(t *testing.T, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), line) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q within 10s:\n%s", line, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fullDiskConfig is testConfig with the state directory's tmpfs too small
// for workspace quotas: these tests fill berth's own disk, not a workspace.
func fullDiskConfig() *config.Config {
	cfg := testConfig(4)
	for i := range cfg.Agents {
		cfg.Agents[i].WorkspaceQuota = new(config.Bytes)
	}
	return cfg
}

func withLog(b *logBuffer) func(*Options) {
	return func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(b, nil)) }
}

// bigText needs pages that the database file does not have yet.
func bigText(c byte) string { return strings.Repeat(string(c), 256<<10) }

func TestSubmitOnAFullDiskFailsForNowStoresNothingAndIsTakenOnceWhenThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 8<<20)
	var logs logBuffer
	s := newTestService(t, fullDiskConfig(), dir, newGateBackend("landlock"), nil, withLog(&logs))
	filler := fulldisk.Fill(t, dir)

	// bbolt may fit a few runs into pages its file already has; the first
	// that does not fit is refused.
	var refused string
	var refusal error
	for i := 0; refused == ""; i++ {
		if i == 100 {
			t.Fatal("100 Submits on a full disk were all taken")
		}
		id := fmt.Sprintf("hooks/m%02d", i)
		_, err := s.Submit(busapi.SubmissionFromWire(map[string]string{"id": id, "agent": "alpha", "text": bigText('a')}))
		if err != nil {
			refused, refusal = id, err
		}
	}
	name := bus.ErrorName(dbusError(refusal))
	if name == bus.ErrInvalidArgument || name == "" {
		t.Errorf("a full disk is answered with %q: intake would take it as a refusal for good", name)
	}
	if !strings.Contains(refusal.Error(), "state disk is full") {
		t.Errorf("Submit's error %q does not say the disk is full", refusal)
	}
	runs, err := s.ListRuns(RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.MessageID == refused {
			t.Fatalf("the refused Submit stored run %s", r.ID)
		}
	}

	filler.Free(t)
	first := submit(t, s, refused, "alpha")
	again := submit(t, s, refused, "alpha")
	if first != again {
		t.Errorf("the message was taken twice: runs %s and %s", first, again)
	}
	runs, err = s.ListRuns(RunFilter{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range runs {
		if r.MessageID == refused {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d runs for the message, want 1", n)
	}
	if !strings.Contains(logs.String(), "state disk is full") || !strings.Contains(logs.String(), "state_dir="+dir) {
		t.Errorf("the full disk was not logged with its directory:\n%s", logs.String())
	}
}

func TestAFinishedRunWhoseRecordMeetsAFullDiskIsRecordedOnceThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 8<<20)
	var logs logBuffer
	b := newGateBackend("landlock")
	s := newTestService(t, fullDiskConfig(), dir, b, nil, withLog(&logs))
	id := submit(t, s, "hooks/m1", "alpha")
	start(t, s)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	run := b.next(t)

	filler := fulldisk.Fill(t, dir)
	reply := bigText('r')
	run.reply(reply)
	logs.waitLog(t, "cannot record run outcome: the state disk is full")
	if r, err := s.GetRun(id); err != nil || r.State != StateRunning {
		t.Fatalf("while the outcome waits for room the run is %q (%v), want running", r.State, err)
	}
	// Its agent starts nothing else meanwhile, and the scheduler goes on.
	waitPass(t, s)

	filler.Free(t)
	r := waitState(t, s, id, StateSucceeded)
	if r.Reply != reply {
		t.Errorf("recorded reply is %d bytes, want the run's %d", len(r.Reply), len(reply))
	}
	logs.waitLog(t, "run outcome recorded once the disk had room")

	// And the next message runs as usual.
	id2 := submit(t, s, "hooks/m2", "alpha")
	b.next(t).reply("second")
	waitState(t, s, id2, StateSucceeded)
}

func TestQueuedRunsWaitOutAFullDiskAndStartOnceThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 8<<20)
	var logs logBuffer
	b := newGateBackend("landlock")
	s := newTestService(t, fullDiskConfig(), dir, b, nil, withLog(&logs))
	// Its record is large: marking it running needs pages the file lacks.
	id := submit(t, s, "hooks/m1", "alpha", "text", bigText('q'))
	filler := fulldisk.Fill(t, dir)
	_, done := runInBackground(t, s)
	logs.waitLog(t, "state disk is full")
	waitPass(t, s) // the dispatcher goes on passing
	select {
	case err := <-done:
		t.Fatalf("Run ended on a full disk: %v", err)
	default:
	}
	if r, err := s.GetRun(id); err != nil || r.State != StateQueued {
		t.Fatalf("on a full disk the run is %q (%v), want queued", r.State, err)
	}

	filler.Free(t)
	wake(s.wakeDispatch)
	b.next(t).reply("done")
	waitState(t, s, id, StateSucceeded)
}

func TestASchedulerStartingOnAFullDiskReconcilesOnceThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 8<<20)
	now := time.Now()
	// An earlier scheduler died during r1, whose record is large: putting it
	// back in the queue needs pages the database file does not have yet.
	writeRuns(t, dir, Run{ID: "r1", MessageID: "m-r1", Agent: "alpha", Connector: "hook", Text: bigText('i'),
		State: StateRunning, Backend: "landlock", Handle: "pid:r1", Attempts: 1, Seq: 1, CreatedAt: now, StartedAt: now})
	filler := fulldisk.Fill(t, dir)
	var logs logBuffer
	b := newGateBackend("landlock")
	s := newTestService(t, fullDiskConfig(), dir, b, nil, withLog(&logs))
	_, done := runInBackground(t, s)
	logs.waitLog(t, "the state disk is full; trying again")
	select {
	case err := <-done:
		t.Fatalf("the scheduler gave up on a full disk: %v", err)
	default:
	}
	if r, err := s.GetRun("r1"); err != nil || r.State != StateRunning {
		t.Fatalf("while the disk is full r1 is %q (%v), want it left as it was", r.State, err)
	}

	filler.Free(t)
	run := b.next(t)
	if run.spec.RunID != "r1" {
		t.Fatalf("first run started is %s, want the interrupted r1", run.spec.RunID)
	}
	run.reply("done")
	if r := waitState(t, s, "r1", StateSucceeded); r.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", r.Attempts)
	}
}
