package scheduler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// gateBackend is an isolation backend the test drives through channels: each
// run reports itself on started and ends when the test sends its outcome (or
// when its context ends, or its Spec.Timeout passes, like a real backend).
// It also records overlaps, which is what the scheduler promises to avoid.
type gateBackend struct {
	name    string
	started chan *gatedRun

	mu            sync.Mutex
	inFlight      map[string]int // agent → running now
	total         int
	maxTotal      int
	agentOverlaps int
	killed        []string
	seen          map[string]bool // runs next returned
}

type gatedRun struct {
	spec   isolation.Spec
	finish chan outcome
}

type outcome struct {
	res isolation.Result
	err error
}

func newGateBackend(name string) *gateBackend {
	return &gateBackend{name: name, started: make(chan *gatedRun, 100), inFlight: map[string]int{}, seen: map[string]bool{}}
}

func (b *gateBackend) Name() string { return b.name }

func (b *gateBackend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	b.mu.Lock()
	b.inFlight[spec.AgentID]++
	if b.inFlight[spec.AgentID] > 1 {
		b.agentOverlaps++
	}
	b.total++
	b.maxTotal = max(b.maxTotal, b.total)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inFlight[spec.AgentID]--
		b.total--
		b.mu.Unlock()
	}()

	if spec.OnStart != nil {
		spec.OnStart("gate:" + spec.RunID)
	}
	run := &gatedRun{spec: spec, finish: make(chan outcome, 1)}
	b.started <- run
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = time.Hour
	}
	select {
	case o := <-run.finish:
		return o.res, o.err
	case <-ctx.Done():
		return isolation.Result{Stderr: "killed"}, &isolation.RunError{Reason: isolation.ReasonCanceled, Err: ctx.Err()}
	case <-time.After(timeout):
		return isolation.Result{Stderr: "still busy"}, isolation.Errorf(isolation.ReasonTimeout, "no response within %s", timeout)
	}
}

func (b *gateBackend) Kill(_ context.Context, handle string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.killed = append(b.killed, handle)
	return nil
}

func (b *gateBackend) stats() (agentOverlaps, maxTotal int, killed []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.agentOverlaps, b.maxTotal, append([]string(nil), b.killed...)
}

// next waits for the next run to start.
func (b *gateBackend) next(t *testing.T) *gatedRun {
	t.Helper()
	select {
	case r := <-b.started:
		b.mu.Lock()
		b.seen[r.spec.RunID] = true
		b.mu.Unlock()
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no run started within 10s")
		return nil
	}
}

// none asserts that s started no run the test has not seen start: it waits
// for a dispatcher pass that began after the call (an event, not a sleep);
// a run started then is in s.active by the end of that pass.
func (b *gateBackend) none(t *testing.T, s *Service) {
	t.Helper()
	waitPass(t, s)
	s.mu.Lock()
	var started []string
	for id := range s.active {
		b.mu.Lock()
		if !b.seen[id] {
			started = append(started, id)
		}
		b.mu.Unlock()
	}
	s.mu.Unlock()
	if len(started) > 0 {
		t.Fatalf("runs %v started, want none", started)
	}
	select {
	case r := <-b.started:
		t.Fatalf("run %s of agent %s started, want none", r.spec.RunID, r.spec.AgentID)
	default:
	}
}

// passes signals the dispatcher passes of each test service.
var passes sync.Map // *Service → chan struct{}

// waitPass waits for a whole dispatcher pass that began after the call.
func waitPass(t *testing.T, s *Service) {
	t.Helper()
	v, ok := passes.Load(s)
	if !ok {
		t.Fatal("service was not made by newTestService")
	}
	ch := v.(chan struct{})
	select {
	case <-ch:
	default:
	}
	for range 2 {
		wake(s.wakeDispatch)
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the dispatcher did not pass within 10s")
		}
	}
}

func (r *gatedRun) reply(text string) {
	r.finish <- outcome{res: isolation.Result{Response: agentproto.Response{Version: 1, RunID: r.spec.RunID, Reply: text}}}
}

// testConfig has agents alpha, beta and gamma on the landlock backend. It
// starts from config.Defaults, where every default (agent_uids among them)
// is declared once.
func testConfig(maxConcurrent int) *config.Config {
	cfg := config.Defaults()
	cfg.Agents = []config.AgentSettings{{ID: "alpha"}, {ID: "beta"}, {ID: "gamma"}}
	cfg.AgentDefaults = config.AgentSettings{WorkspaceQuota: new(config.Bytes)}
	cfg.Scheduler.MaxConcurrentRuns = maxConcurrent
	cfg.Scheduler.DefaultTimeout = time.Minute
	cfg.Scheduler.RunAs = "nobody"
	cfg.Scheduler.AgentBinary = "/nonexistent/berth-agent"
	return cfg
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestService opens a service in stateDir (a new temp dir when empty)
// with b as its landlock backend. It is closed when the test ends. with
// changes the options (a fake clock, say).
func newTestService(t *testing.T, cfg *config.Config, stateDir string, b *gateBackend, d Deliverer, with ...func(*Options)) *Service {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	opts := Options{
		Backends: map[string]isolation.Backend{"landlock": b},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	}
	if d != nil { // a nil *deliveries must stay a nil interface
		opts.Deliverer = d
	}
	for _, f := range with {
		f(&opts)
	}
	s, err := New(cfg, stateDir, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ch := make(chan struct{}, 1)
	passes.Store(s, ch)
	s.passed = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { s.Close(); passes.Delete(s) })
	return s
}

// withClock runs the service on clock.
func withClock(clock clockwork.Clock) func(*Options) {
	return func(o *Options) { o.Clock = clock }
}

// start runs s until the returned stop is called (or the test ends).
func start(t *testing.T, s *Service) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func submit(t *testing.T, s *Service, msgID, agent string, extra ...string) string {
	t.Helper()
	msg := map[string]string{"id": msgID, "agent": agent, "text": "hello " + msgID}
	for i := 0; i+1 < len(extra); i += 2 {
		msg[extra[i]] = extra[i+1]
	}
	id, err := s.Submit(busapi.SubmissionFromWire(msg))
	if err != nil {
		t.Fatalf("Submit(%s): %v", msgID, err)
	}
	return id
}

// waitState waits until run id is in state and returns it.
func waitState(t *testing.T, s *Service, id, state string) Run {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := s.GetRun(id)
		if err == nil && r.State == state {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %q (err %v), want %q", id, r.State, err, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// deliveries records what a Deliverer was given; it fails the first
// failFirst calls.
type deliveries struct {
	mu        sync.Mutex
	failFirst int
	calls     int
	delivered []busapi.Reply
	notify    chan struct{}
}

func newDeliveries(failFirst int) *deliveries {
	return &deliveries{failFirst: failFirst, notify: make(chan struct{}, 100)}
}

func (d *deliveries) Deliver(_ context.Context, reply busapi.Reply) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	defer func() {
		select {
		case d.notify <- struct{}{}:
		default:
		}
	}()
	if d.calls <= d.failFirst {
		return errors.New("intake is not there")
	}
	d.delivered = append(d.delivered, reply)
	return nil
}

func (d *deliveries) snapshot() (calls int, delivered []busapi.Reply) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls, append([]busapi.Reply(nil), d.delivered...)
}
