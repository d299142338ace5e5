package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	boxes "github.com/berth-dev/berth/isolation/container"
)

// fastSink is a chat platform that takes every reply at once and notes
// when each arrived, by message id.
type fastSink struct {
	srv     *httptest.Server
	mu      sync.Mutex
	arrived map[string]time.Time
	runIDs  map[string]string // message id → its run
	waiting map[string]chan struct{}
	failed  []string // replies of runs that did not succeed: "id: error"
}

func newFastSink(b *testing.B) *fastSink {
	s := &fastSink{arrived: map[string]time.Time{}, runIDs: map[string]string{}, waiting: map[string]chan struct{}{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		body, _ := io.ReadAll(r.Body)
		var reply struct {
			ID    string `json:"id"`
			RunID string `json:"run_id"`
			State string `json:"state"`
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &reply)
		s.mu.Lock()
		if reply.State != "succeeded" {
			s.failed = append(s.failed, reply.ID+": "+reply.State+": "+reply.Error)
		}
		if _, ok := s.arrived[reply.ID]; !ok {
			s.arrived[reply.ID] = at
			s.runIDs[reply.ID] = reply.RunID
			if ch := s.waiting[reply.ID]; ch != nil {
				close(ch)
			}
		}
		s.mu.Unlock()
	}))
	b.Cleanup(s.srv.Close)
	return s
}

// expect returns a channel closed when id's reply arrives.
func (s *fastSink) expect(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if _, ok := s.arrived[id]; ok {
		close(ch)
	}
	s.waiting[id] = ch
	return ch
}

func (s *fastSink) runID(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runIDs[id]
}

func (s *fastSink) at(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrived[id]
}

// benchStack is the suite as systemd runs it: agents a0…a7 (Landlock host
// runs, local provider), free (file_access unrestricted), each bound to the
// channel of its name, max_concurrent_runs 8.
func benchStack(b *testing.B, warmContainers ...string) (*devstack.Stack, *fastSink) {
	b.Helper()
	testenv.NeedRoot(b)
	if buildErr != nil {
		b.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newFastSink(b)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	agents := []string{"free"}
	for i := range 8 {
		agents = append(agents, fmt.Sprintf("a%d", i))
	}
	for _, a := range agents {
		extra := ""
		if a == "free" {
			extra = "[agents.file_access]\nunrestricted = true\n"
		}
		fmt.Fprintf(&cfg, "[[agents]]\nid = %q\nmax_iterations = 4\n%s\n", a, extra)
	}
	for _, a := range warmContainers {
		fmt.Fprintf(&cfg, "[[agents]]\nid = %q\nmax_iterations = 4\n%s\nwarm = 1\n\n", a, containerAgent)
		agents = append(agents, a)
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = \"a0\"\n\n")
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, sink.srv.URL+"/replies")
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = %q\nagent = %q\n\n", a, a)
	}
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = 8\ndefault_timeout_seconds = 60\nrun_as = \"nobody\"\nagent_binary = %q\n", filepath.Join(binDir, "berth-agent"))
	dir, err := os.MkdirTemp(baseDir, "b-")
	if err != nil {
		b.Fatal(err)
	}
	var env []string
	if v := os.Getenv("BENCH_E2E_LOG_LEVEL"); v != "" {
		env = append(env, "BERTH_LOG_LEVEL="+v)
	}
	st, err := devstack.Start(devstack.Options{BinDir: binDir, Dir: dir, Config: cfg.String(), Env: env})
	if err != nil {
		b.Fatalf("cannot start the suite: %v", err)
	}
	b.Cleanup(st.Stop)
	return st, sink
}

var benchSeq struct {
	mu sync.Mutex
	n  int
}

func nextBenchID() string {
	benchSeq.mu.Lock()
	defer benchSeq.mu.Unlock()
	benchSeq.n++
	return "bench-" + strconv.Itoa(benchSeq.n)
}

// postTo posts a signed message to agent's channel and returns its id once
// intake answered 202.
func postTo(b *testing.B, st *devstack.Stack, agent string) string {
	b.Helper()
	return postText(b, st, agent, "ping")
}

// postText posts text (followed by the message's id when it is "ping") to
// agent's channel and returns the message's id once intake answered 202.
func postText(b *testing.B, st *devstack.Stack, agent, text string) string {
	b.Helper()
	id := nextBenchID()
	if text == "ping" {
		text += " " + id
	}
	body, _ := json.Marshal(map[string]string{"id": id, "channel": agent, "author": "bench", "text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := st.Post(ctx, "hooks", []byte(secret), body)
	if err != nil {
		b.Fatalf("POST: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b.Fatalf("POST: %s", resp.Status)
	}
	return id
}

// failures fails the benchmark when a run did not succeed: a failing run
// is no figure of a working one.
func (s *fastSink) failures(b *testing.B) {
	b.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failed) > 0 {
		b.Fatalf("%d runs did not succeed, the first: %s", len(s.failed), s.failed[0])
	}
}

func waitFor(b *testing.B, ch <-chan struct{}, what string) {
	b.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Minute):
		b.Fatalf("no reply for %s within 2 minutes", what)
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkWholePath: signed POSTs to the real daemons (socket-activated
// intake, D-Bus-activated scheduler, Landlock host runs of berth-agent with
// the local provider), replies received by a fake platform that answers at
// once. latency: one sender, POST → reply, one message at a time (a Landlock
// agent beside a file_access-unrestricted one, and the POST → 202 alone);
// one-agent: BENCH_E2E_RUNS messages to one agent at once, runs/s until the
// last reply; 8-agents: as many to each of 8 agents.
func BenchmarkWholePath(b *testing.B) {
	runs := 60
	if v, err := strconv.Atoi(os.Getenv("BENCH_E2E_RUNS")); err == nil && v > 0 {
		runs = v
	}
	st, sink := benchStack(b)
	// Warm up: the scheduler's activation, the first run's caches.
	for _, a := range []string{"a0", "free"} {
		id := postTo(b, st, a)
		waitFor(b, sink.expect(id), id)
	}

	b.Run("latency", func(b *testing.B) {
		var landlock, free, accept []time.Duration
		var landlockIDs []string
		for range runs / 2 {
			for _, agent := range []string{"a0", "free"} {
				start := time.Now()
				id := postTo(b, st, agent)
				accepted := time.Since(start)
				ch := sink.expect(id)
				waitFor(b, ch, id)
				took := sink.at(id).Sub(start)
				if agent == "free" {
					free = append(free, took)
				} else {
					landlock = append(landlock, took)
					accept = append(accept, accepted)
					landlockIDs = append(landlockIDs, sink.runID(id))
				}
			}
		}
		keepLogs(b, st)
		sink.failures(b)
		b.ReportMetric(ms(quantile(landlock, 0.5)), "landlock_p50_ms")
		b.ReportMetric(ms(quantile(landlock, 0.95)), "landlock_p95_ms")
		b.ReportMetric(ms(quantile(free, 0.5)), "unrestricted_p50_ms")
		toConfined, toEnd := runSplit(b, st, landlockIDs)
		b.ReportMetric(ms(quantile(toConfined, 0.5)), "start_to_confined_p50_ms")
		b.ReportMetric(ms(quantile(toEnd, 0.5)), "confined_to_end_p50_ms")
		b.ReportMetric(ms(quantile(accept, 0.5)), "accept_p50_ms")
	})
	for _, tc := range []struct {
		name   string
		agents int
	}{{"one-agent", 1}, {"8-agents", 8}} {
		b.Run(tc.name, func(b *testing.B) {
			total := runs * tc.agents
			ids := make([]string, 0, total)
			chans := make([]<-chan struct{}, 0, total)
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := time.Now()
			for a := range tc.agents {
				wg.Go(func() {
					for range runs {
						id := postTo(b, st, fmt.Sprintf("a%d", a))
						ch := sink.expect(id)
						mu.Lock()
						ids, chans = append(ids, id), append(chans, ch)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			for i, ch := range chans {
				waitFor(b, ch, ids[i])
			}
			last := start
			for _, id := range ids {
				if at := sink.at(id); at.After(last) {
					last = at
				}
			}
			sink.failures(b)
			b.ReportMetric(float64(total)/last.Sub(start).Seconds(), "runs/s")
		})
	}
}

// keepLogs copies intake's and the bus's logs (the scheduler's is in the
// bus's: it is D-Bus-activated) to BENCH_E2E_LOGS when set, for a breakdown
// of where a message's time goes.
func keepLogs(b *testing.B, st *devstack.Stack) {
	dir := os.Getenv("BENCH_E2E_LOGS")
	if dir == "" {
		return
	}
	for name, p := range map[string]string{"intake.log": st.IntakeLog, "bus.log": st.Bus.LogPath} {
		if data, err := os.ReadFile(p); err == nil {
			_ = os.WriteFile(filepath.Join(dir, name), data, 0o644)
		}
	}
}

// runSplit splits each run's time in the scheduler (GetRun's started_usec
// to finished_usec) at berth-agent's "confined with Landlock" line, logged
// right after it read its request: the host run's setup, exec and the
// agent's start before it; the agent's work, exit, teardown and the
// outcome's commit after it.
func runSplit(b *testing.B, st *devstack.Stack, runIDs []string) (toConfined, toEnd []time.Duration) {
	b.Helper()
	conn, err := st.Conn()
	if err != nil {
		b.Fatalf("cannot connect to the suite's bus: %v", err)
	}
	defer conn.Close()
	sched := busapi.NewScheduler(conn)
	for _, id := range runIDs {
		run, err := sched.GetRun(context.Background(), id)
		if err != nil {
			b.Fatalf("GetRun %s: %v", id, err)
		}
		for line := range strings.Lines(run.StderrTail.Text) {
			var l struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "confined with Landlock" {
				continue
			}
			toConfined = append(toConfined, l.Time.Sub(run.StartedAt))
			toEnd = append(toEnd, run.FinishedAt.Sub(l.Time))
			break
		}
	}
	if len(toConfined) == 0 {
		b.Fatal("no run's stderr has berth-agent's \"confined with Landlock\" line")
	}
	return toConfined, toEnd
}

// BenchmarkWarmContainer measures POST → reply for a container agent with a
// warm pool (warm = 1), one message at a time, each sent once the pool has a
// container again (so every message is a hand-off to a waiting container),
// beside a Landlock agent of the same stack. "ping" is the message of
// BenchmarkWholePath (no tool); "/sh true" adds one tool call.
func BenchmarkWarmContainer(b *testing.B) {
	cli := testdocker.Engine(b)
	runs := 30
	if v, err := strconv.Atoi(os.Getenv("BENCH_E2E_RUNS")); err == nil && v > 0 {
		runs = v / 2
	}
	st, sink := benchStack(b, "w0")
	conn, err := st.Conn()
	if err != nil {
		b.Fatal(err)
	}
	// Activate the scheduler: it fills the pool.
	if err := conn.Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		b.Fatalf("cannot activate the scheduler: %v", err)
	}
	pool := boxes.LabelPool + "=w0"
	used := map[string]bool{}
	waitWarm := func() {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			for _, c := range containersLabelled(b, cli, pool) {
				if c.State == "running" && !used[c.ID] {
					used[c.ID] = true
					return
				}
			}
			if time.Now().After(deadline) {
				b.Fatal("the warm pool of w0 has no new container within 2 minutes")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	measure := func(agent, text string) []time.Duration {
		var took []time.Duration
		for range runs {
			if agent == "w0" {
				waitWarm()
			}
			start := time.Now()
			id := postText(b, st, agent, text)
			waitFor(b, sink.expect(id), id)
			took = append(took, sink.at(id).Sub(start))
		}
		return took
	}
	// Warm up: the scheduler's activation, the default image, the pool.
	measure("w0", "ping")
	measure("a0", "ping")
	b.ResetTimer()
	warm, landlock := measure("w0", "ping"), measure("a0", "ping")
	warmTool := measure("w0", "/sh true")
	keepLogs(b, st)
	sink.failures(b)
	b.ReportMetric(ms(quantile(warm, 0.5)), "warm_p50_ms")
	b.ReportMetric(ms(quantile(warm, 0.95)), "warm_p95_ms")
	b.ReportMetric(ms(quantile(warmTool, 0.5)), "warm_tool_p50_ms")
	b.ReportMetric(ms(quantile(landlock, 0.5)), "landlock_p50_ms")
}
