package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/otlpsink"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	boxes "github.com/berth-dev/berth/isolation/container"
)

// ownImage is the image the benchmark's agent names itself
// (container_mode.image): berth-agent layered on a Debian image
// (berth-base:bookworm, scripts/base-image.sh) when the engine has one, as
// an agent's own image usually is, else on berth's scratch and busybox
// agent image; built with a label of its own, so it is an image of its own
// (another ID), not a second name of one of berth's.
const ownImage = "berth-bench-own:1"

// buildOwnImage builds ownImage and says what it is based on.
func buildOwnImage(b *testing.B, cli *client.Client) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agent := filepath.Join(binDir, "berth-agent")
	from, ref := "", "berth-base:bookworm"
	if img, err := cli.ImageInspect(ctx, ref); err == nil {
		from = img.ID
	} else {
		tag, err := imagectl.Ensure(ctx, cli, imagectl.AgentImage{AgentBinary: agent})
		if err != nil {
			b.Fatalf("cannot build berth-agent's image to base %s on: %v", ownImage, err)
		}
		from, ref = tag, tag+" (scratch and busybox)"
	}
	var buildCtx bytes.Buffer
	if err := (imagectl.IsolatedImage{From: from, BaseRef: ref, BaseHash: from, AgentBinary: agent, Version: "bench"}).WriteContext(&buildCtx); err != nil {
		b.Fatalf("cannot make the build context of %s: %v", ownImage, err)
	}
	if err := imagectl.Build(ctx, cli, &buildCtx, ownImage, map[string]string{"dev.berth.bench": "own-image"}); err != nil {
		b.Fatalf("cannot build %s: %v", ownImage, err)
	}
	return ref
}

// BenchmarkWarmContainerOwnImage measures POST → reply through a warm
// container pool (warm = 1) for an agent that names its own image
// (container_mode.image) beside one with berth's default isolation image
// (berth-imaged's) and a Landlock agent, in one stack, the three
// interleaved message by message; every container message is sent once its
// pool has a new container, so each is a hand-off to a waiting container.
// The message is "ping" (no tool), as in BenchmarkWarmContainer.
func BenchmarkWarmContainerOwnImage(b *testing.B) {
	cli := testdocker.Engine(b)
	testenv.NeedRoot(b)
	if buildErr != nil {
		b.Fatalf("cannot build berth: %v", buildErr)
	}
	base := buildOwnImage(b, cli)
	runs := 30
	if v, err := strconv.Atoi(os.Getenv("BENCH_E2E_RUNS")); err == nil && v > 0 {
		runs = v / 2
	}
	var spans *otlpsink.Sink
	if os.Getenv("BENCH_E2E_TRACE") != "" {
		spans = otlpsink.Start(b)
	}
	st, sink := ownImageStack(b, spans)
	conn, err := st.Conn()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		b.Fatalf("cannot activate the scheduler: %v", err)
	}
	used := map[string]bool{}
	waitWarm := func(agent string) {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			for _, c := range containersLabelled(b, cli, boxes.LabelPool+"="+agent) {
				if c.State == "running" && !used[c.ID] {
					used[c.ID] = true
					return
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("the warm pool of %s has no new container within 2 minutes", agent)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	agents := []string{"wdefault", "wown", "a0"}
	took := map[string][]time.Duration{}
	runIDs := map[string][]string{}
	posted := map[string][]time.Time{}
	measure := func(n int) {
		for i := range n {
			// The order turns every message, so no agent always follows another.
			for j := range agents {
				agent := agents[(i+j)%len(agents)]
				if agent != "a0" {
					waitWarm(agent)
				}
				start := time.Now()
				id := postText(b, st, agent, "ping")
				waitFor(b, sink.expect(id), id)
				took[agent] = append(took[agent], sink.at(id).Sub(start))
				runIDs[agent] = append(runIDs[agent], sink.runID(id))
				posted[agent] = append(posted[agent], start)
			}
		}
	}
	// Warm up: the scheduler's activation, the default image, the pools.
	measure(2)
	clear(took)
	clear(runIDs)
	clear(posted)
	b.ResetTimer()
	measure(runs)
	b.StopTimer()
	keepLogs(b, st)
	sink.failures(b)
	b.ReportMetric(ms(quantile(took["wdefault"], 0.5)), "default_image_p50_ms")
	b.ReportMetric(ms(quantile(took["wdefault"], 0.95)), "default_image_p95_ms")
	b.ReportMetric(ms(quantile(took["wown"], 0.5)), "own_image_p50_ms")
	b.ReportMetric(ms(quantile(took["wown"], 0.95)), "own_image_p95_ms")
	b.ReportMetric(ms(quantile(took["a0"], 0.5)), "landlock_p50_ms")
	for agent, name := range map[string]string{"wdefault": "default_image", "wown": "own_image"} {
		toConfined, toEnd := runSplit(b, st, runIDs[agent])
		b.ReportMetric(ms(quantile(toConfined, 0.5)), name+"_start_to_confined_p50_ms")
		b.ReportMetric(ms(quantile(toEnd, 0.5)), name+"_confined_to_end_p50_ms")
	}
	b.Logf("%s is berth-agent on %s", ownImage, base)
	if spans != nil {
		for _, agent := range agents {
			logWaterfall(b, st, spans, agent, runIDs[agent], posted[agent], took[agent])
		}
	}
}

// logWaterfall logs where agent's POST → reply went, from its runs' traces:
// each span as the median of its start and its end after the POST, in the
// order they start, then the reply's arrival at the platform.
func logWaterfall(b *testing.B, st *devstack.Stack, sink *otlpsink.Sink, agent string, runIDs []string, posted []time.Time, took []time.Duration) {
	b.Helper()
	conn, err := st.Conn()
	if err != nil {
		b.Fatalf("cannot connect to the suite's bus: %v", err)
	}
	defer conn.Close()
	sched := busapi.NewScheduler(conn)
	traces := map[string]time.Time{}       // trace id → its POST
	logged := map[string][]time.Duration{} // the agent's log lines, the record's end: after the POST
	for i, id := range runIDs {
		run, err := sched.GetRun(context.Background(), id)
		if err != nil {
			b.Fatalf("GetRun %s: %v", id, err)
		}
		if run.TraceID != "" {
			traces[run.TraceID] = posted[i]
		}
		for line := range strings.Lines(run.StderrTail.Text) {
			var l struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg != "" {
				logged["berth-agent log \""+l.Msg+"\""] = append(logged["berth-agent log \""+l.Msg+"\""], l.Time.Sub(posted[i]))
			}
		}
		logged["scheduler run ended (record)"] = append(logged["scheduler run ended (record)"], run.FinishedAt.Sub(posted[i]))
	}
	all := sink.Wait(b, 30*time.Second, func(spans []otlpsink.Span) bool {
		delivered := map[string]bool{}
		for _, sp := range spans {
			if sp.Name == "intake.deliver" {
				delivered[sp.TraceID] = true
			}
		}
		for tr := range traces {
			if !delivered[tr] {
				return false
			}
		}
		return true
	})
	type offsets struct{ start, end []time.Duration }
	byName := map[string]*offsets{}
	for _, sp := range all {
		post, ok := traces[sp.TraceID]
		if !ok {
			continue
		}
		name := sp.Service + " " + sp.Name
		o := byName[name]
		if o == nil {
			o = &offsets{}
			byName[name] = o
		}
		o.start = append(o.start, sp.Start.Sub(post))
		o.end = append(o.end, sp.End.Sub(post))
	}
	for name, at := range logged {
		byName[name] = &offsets{start: at, end: at}
	}
	names := slices.Collect(maps.Keys(byName))
	slices.SortFunc(names, func(x, y string) int {
		return cmp.Compare(quantile(byName[x].start, 0.5), quantile(byName[y].start, 0.5))
	})
	var w strings.Builder
	fmt.Fprintf(&w, "%s: %d traces, POST → reply p50 %.1f ms; spans as p50 start → end after the POST (n):\n", agent, len(traces), ms(quantile(took, 0.5)))
	for _, n := range names {
		o := byName[n]
		fmt.Fprintf(&w, "  %-36s %7.2f → %7.2f ms (%d)\n", n, ms(quantile(o.start, 0.5)), ms(quantile(o.end, 0.5)), len(o.start))
	}
	fmt.Fprint(os.Stderr, w.String()) // b.Log cuts a benchmark's log at ten lines
}

// ownImageStack is the suite as systemd runs it with three agents: a0
// (Landlock), wdefault (container, warm = 1, berth's isolation image) and
// wown (container, warm = 1, container_mode.image = ownImage).
func ownImageStack(b *testing.B, spans *otlpsink.Sink) (*devstack.Stack, *fastSink) {
	b.Helper()
	sink := newFastSink(b)
	var cfg strings.Builder
	if spans != nil {
		fmt.Fprintf(&cfg, "[tracing]\nendpoint = %q\n\n", spans.HTTP)
	}
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	fmt.Fprintf(&cfg, "[[agents]]\nid = \"a0\"\nmax_iterations = 4\n\n")
	fmt.Fprintf(&cfg, "[[agents]]\nid = \"wdefault\"\nmax_iterations = 4\n%s\nwarm = 1\n\n", containerAgent)
	fmt.Fprintf(&cfg, "[[agents]]\nid = \"wown\"\nmax_iterations = 4\n%s\nwarm = 1\nimage = %q\n\n", containerAgent, ownImage)
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = \"a0\"\n\n")
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, sink.srv.URL+"/replies")
	for _, a := range []string{"a0", "wdefault", "wown"} {
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
