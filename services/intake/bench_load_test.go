package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// runLoad keeps the real daemons (internal/testkit/devstack: berth-intake
// socket-activated, berth-scheduler D-Bus-activated, Landlock host runs of
// berth-agent with the local provider) running agents: each of agents
// a0…a7 always has two messages in its line, the next posted as a reply
// arrives, so up to max_concurrent_runs (8) runs execute all the time.
type runLoad struct {
	st      *devstack.Stack
	sink    *httptest.Server
	replies chan string // the agent each reply was for
	done    atomic.Int64
	failed  atomic.Int64
	seq     atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

const loadAgents = 8

// startRunStack builds berth and starts the suite; its load is off until
// run is called.
func startRunStack(b *testing.B) *runLoad {
	b.Helper()
	testenv.NeedRoot(b)
	// 0755 all the way down: agents run as nobody and must exec berth-agent.
	base, err := os.MkdirTemp("", "bl-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(base) })
	_ = os.Chmod(base, 0o755)
	binDir := filepath.Join(base, "bin")
	_, file, _, _ := runtime.Caller(0)
	if err := devstack.Build(filepath.Join(filepath.Dir(file), "..", ".."), binDir); err != nil {
		b.Fatalf("cannot build berth: %v", err)
	}
	l := &runLoad{replies: make(chan string, 1024)}
	l.sink = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var reply struct {
			ID    string `json:"id"`
			State string `json:"state"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &reply)
		if reply.State != "succeeded" {
			l.failed.Add(1)
		}
		l.done.Add(1)
		// ids are "load-<agent>-<n>"
		if parts := strings.SplitN(reply.ID, "-", 3); len(parts) == 3 {
			select {
			case l.replies <- parts[1]:
			default:
			}
		}
	}))
	b.Cleanup(l.sink.Close)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	for i := range loadAgents {
		fmt.Fprintf(&cfg, "[[agents]]\nid = \"a%d\"\nmax_iterations = 4\n\n", i)
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = \"a0\"\n\n")
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", testSecret, l.sink.URL+"/replies")
	for i := range loadAgents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = \"a%d\"\nagent = \"a%d\"\n\n", i, i)
	}
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = %d\ndefault_timeout_seconds = 60\nrun_as = \"nobody\"\nagent_binary = %q\n", loadAgents, filepath.Join(binDir, "berth-agent"))
	dir := filepath.Join(base, "s")
	l.st, err = devstack.Start(devstack.Options{BinDir: binDir, Dir: dir, Config: cfg.String()})
	if err != nil {
		b.Fatalf("cannot start the suite: %v", err)
	}
	b.Cleanup(l.st.Stop)
	// The first run activates the scheduler and warms its caches.
	l.post(b, "a0")
	select {
	case <-l.replies:
	case <-time.After(2 * time.Minute):
		b.Fatal("no reply from the suite within 2 minutes")
	}
	return l
}

// post sends one message to agent's channel through the suite's intake.
func (l *runLoad) post(b *testing.B, agent string) {
	id := fmt.Sprintf("load-%s-%d", agent, l.seq.Add(1))
	body, _ := json.Marshal(map[string]string{"id": id, "channel": agent, "author": "bench", "text": "ping " + id})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := l.st.Post(ctx, "hooks", []byte(testSecret), body)
	if err != nil {
		b.Errorf("POST to the suite: %v", err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b.Errorf("POST to the suite: %s", resp.Status)
	}
}

// run starts the load and returns once runs are flowing; the returned
// function stops it, waits for the runs in flight and returns how many
// runs ended while it was on, and in how long.
func (l *runLoad) run(b *testing.B) func() (int64, time.Duration) {
	l.stop = make(chan struct{})
	before := l.done.Load()
	start := time.Now()
	inFlight := atomic.Int64{}
	for i := range loadAgents {
		for range 2 {
			inFlight.Add(1)
			l.post(b, fmt.Sprintf("a%d", i))
		}
	}
	l.wg.Go(func() {
		for {
			select {
			case agent := <-l.replies:
				inFlight.Add(-1)
				select {
				case <-l.stop:
					if inFlight.Load() <= 0 {
						return
					}
					continue
				default:
				}
				inFlight.Add(1)
				l.post(b, agent)
			case <-time.After(2 * time.Minute):
				b.Errorf("no reply of the load within 2 minutes (%d in flight)", inFlight.Load())
				return
			}
		}
	})
	// Runs are flowing once every agent has had a reply or two.
	for l.done.Load()-before < 2*loadAgents {
		time.Sleep(10 * time.Millisecond)
	}
	return func() (int64, time.Duration) {
		n, took := l.done.Load()-before, time.Since(start)
		close(l.stop)
		l.wg.Wait()
		return n, took
	}
}

// runsCPUFile is the berth-runs cgroup file that holds the CPU weight of
// the suite's runs (ADR 30): the suite's scheduler is in this process's
// cgroup, and its runs in berth-runs below it (cgroup v1 cpu.shares, v2
// cpu.weight). "" when there is none yet.
func runsCPUFile() string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dirs []string
		switch {
		case parts[1] == "" && parts[0] == "0":
			dirs = []string{filepath.Join("/sys/fs/cgroup", parts[2], "berth-runs", "cpu.weight")}
		case slices.Contains(strings.Split(parts[1], ","), "cpu"):
			for _, m := range []string{"cpu", "cpu,cpuacct", "cpuacct,cpu"} {
				dirs = append(dirs, filepath.Join("/sys/fs/cgroup", m, parts[2], "berth-runs", "cpu.shares"))
			}
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); err == nil {
				return d
			}
		}
	}
	return ""
}

// setRunsWeight writes weight w (systemd's scale: 100 is a service) to
// file as the scheduler does, and returns what the file then says.
func setRunsWeight(b *testing.B, file string, w int) string {
	b.Helper()
	value := strconv.Itoa(w)
	if filepath.Base(file) == "cpu.shares" {
		value = strconv.Itoa(max(2, w*1024/100))
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		b.Fatalf("cannot set the runs' CPU weight: %v", err)
	}
	data, _ := os.ReadFile(file)
	return strings.TrimSpace(string(data))
}

// load1 is the one-minute load average.
func load1() float64 {
	data, _ := os.ReadFile("/proc/loadavg")
	var v float64
	_, _ = fmt.Sscan(string(data), &v)
	return v
}

// BenchmarkAcceptBesideRuns: durable accepts per second at 50 concurrent
// senders, intake (group commit) beside the naive one-commit-per-message
// server (BenchmarkAccept's), while the real scheduler runs agents beside
// them (runLoad: 8 Landlock runs at a time, without end) and while it is
// idle. Beside runs it is measured twice: with the runs' group at the
// default runs_cpu_weight (20, ADR 30: "low") and at full weight (100,
// v1 cpu.shares 1024, as before: "full"), written to berth-runs between
// the windows. Every repetition goes through idle, low and full in a
// turned order, and intake and naive alternate inside each, so the noise
// of a shared machine falls on all alike. The accepts are measured in this
// process, as in BenchmarkAccept; the runs are the suite's. BENCH_REPS
// repetitions (default 3), medians; the load average is reported too.
func BenchmarkAcceptBesideRuns(b *testing.B) {
	l := startRunStack(b)
	weightFile := runsCPUFile()
	if weightFile == "" {
		b.Fatal("the suite's runs have no berth-runs cgroup with a CPU weight")
	}
	b.Cleanup(func() { setRunsWeight(b, weightFile, config.DefaultRunsCPUWeight) })
	const senders = 50
	measure := func(naive bool) float64 {
		if naive {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "naive.db"), 0o600, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			srv := httptest.NewServer(naiveAccept(db))
			defer srv.Close()
			n, took := sendFor(b, srv.URL+"/hooks/hooks", senders, acceptWindow)
			return float64(n) / took.Seconds()
		}
		s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		n, took := sendFor(b, srv.URL+"/hooks/hooks", senders, acceptWindow)
		return float64(n) / took.Seconds()
	}
	type phase struct {
		name   string
		weight int // 0: no runs
	}
	phases := []phase{{"idle", 0}, {"low", config.DefaultRunsCPUWeight}, {"full", 100}}
	fig := map[string][]float64{}
	runs := map[string]int64{}
	runTime := map[string]time.Duration{}
	var loads []float64
	b.ResetTimer()
	for rep := range benchReps() {
		loads = append(loads, load1())
		for j := range phases {
			ph := phases[(rep+j)%len(phases)]
			var stop func() (int64, time.Duration)
			if ph.weight > 0 {
				stop = l.run(b)
				want := setRunsWeight(b, weightFile, ph.weight)
				for _, naive := range []bool{rep%2 == 0, rep%2 != 0} {
					fig[figName(naive, ph.name)] = append(fig[figName(naive, ph.name)], measure(naive))
				}
				if data, _ := os.ReadFile(weightFile); strings.TrimSpace(string(data)) != want {
					b.Fatalf("%s changed from %s to %s while measured", weightFile, want, strings.TrimSpace(string(data)))
				}
				n, took := stop()
				runs[ph.name] += n
				runTime[ph.name] += took
				continue
			}
			for _, naive := range []bool{rep%2 == 0, rep%2 != 0} {
				fig[figName(naive, ph.name)] = append(fig[figName(naive, ph.name)], measure(naive))
			}
		}
	}
	b.StopTimer()
	loads = append(loads, load1())
	if n := l.failed.Load(); n > 0 {
		b.Fatalf("%d runs of the load did not succeed", n)
	}
	for _, ph := range phases {
		for _, naive := range []bool{false, true} {
			b.ReportMetric(median(fig[figName(naive, ph.name)]), figName(naive, ph.name)+"_msg/s")
		}
		b.ReportMetric(median(fig[figName(false, ph.name)])/median(fig[figName(true, ph.name)]), "x_naive_"+ph.name)
		if ph.weight > 0 {
			b.ReportMetric(median(fig[figName(false, ph.name)])/median(fig[figName(false, "idle")]), "of_idle_"+ph.name)
			b.ReportMetric(float64(runs[ph.name])/runTime[ph.name].Seconds(), "runs/s_"+ph.name)
		}
	}
	b.ReportMetric(slices.Min(loads), "load1_min")
	b.ReportMetric(slices.Max(loads), "load1_max")
}

// figName is a figure's name: intake_low, naive_idle, …
func figName(naive bool, phase string) string {
	if naive {
		return "naive_" + phase
	}
	return "intake_" + phase
}
