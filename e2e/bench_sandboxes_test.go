package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	boxes "github.com/berth-dev/berth/isolation/container"
	"github.com/moby/moby/client"
)

// conversationAgent keeps a sandbox per thread for an hour: nothing is
// reaped while the benchmark runs, and 50 idle ones fit beside the one
// measured.
const conversationAgent = `[agents.sandbox]
scope = "conversation"
idle_stop = "1h"
max_per_agent = 64`

// sandboxStack is the suite as systemd runs it, each agent on the channel
// of its name: msg, conv and convnet (Landlock host runs) and, when
// withContainers, cmsg, cconv and cconvnet (containers, network none, no
// warm pool); conv, convnet, cconv and cconvnet keep a sandbox per
// conversation, msg and cmsg get a fresh one per message.
func sandboxStack(b *testing.B, withContainers bool) (*devstack.Stack, *fastSink) {
	b.Helper()
	testenv.NeedRoot(b)
	if buildErr != nil {
		b.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newFastSink(b)
	// convnet and cconvnet have an egress rule, so their sandboxes have an
	// egress proxy whose memory is measured (the local provider needs none).
	const egressRule = "[agents.egress]\nallow = [\"example.invalid\"]\n"
	agents := map[string]string{"msg": "", "conv": conversationAgent, "convnet": egressRule + conversationAgent}
	if withContainers {
		agents["cmsg"] = containerAgent
		agents["cconv"] = containerAgent + "\n" + conversationAgent
		agents["cconvnet"] = egressRule + containerAgent + "\n" + conversationAgent
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	for a, extra := range agents {
		fmt.Fprintf(&cfg, "[[agents]]\nid = %q\nmax_iterations = 4\n%s\n\n", a, extra)
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = \"msg\"\n\n")
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, sink.srv.URL+"/replies")
	for a := range agents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = %q\nagent = %q\n\n", a, a)
	}
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = 8\ndefault_timeout_seconds = 60\nrun_as = \"nobody\"\negress_user = \"daemon\"\nagent_binary = %q\n", filepath.Join(binDir, "berth-agent"))
	// Directly under /tmp: a sandbox's egress socket path is longer than a
	// run's (its id has a prefix), and under baseDir it is over the 107
	// bytes a Unix socket address holds.
	dir, err := os.MkdirTemp("/tmp", "s")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
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

// postInThread posts "ping <id>" to agent's channel in thread and returns
// the message's id once intake answered 202.
func postInThread(b *testing.B, st *devstack.Stack, agent, thread string) string {
	b.Helper()
	id := nextBenchID()
	body, _ := json.Marshal(map[string]string{"id": id, "channel": agent, "thread": thread, "author": "bench", "text": "ping " + id})
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

// sandboxMeasure is one message's figures: POST → reply at the fake
// platform, and the run (GetRun's started → finished) in the scheduler.
type sandboxMeasure struct {
	postToReply, run []time.Duration
	runIDs           []string
}

// ask posts one message, waits for its reply and records both figures; in
// a conversation agent the run must have run in a kept sandbox (a fallback
// to a fresh one would be no figure of a live sandbox).
func (m *sandboxMeasure) ask(b *testing.B, st *devstack.Stack, sched busapi.Scheduler, sink *fastSink, agent, thread string, conversation bool) {
	b.Helper()
	start := time.Now()
	id := postInThread(b, st, agent, thread)
	waitFor(b, sink.expect(id), id)
	m.postToReply = append(m.postToReply, sink.at(id).Sub(start))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := sched.GetRun(ctx, sink.runID(id))
	if err != nil {
		b.Fatalf("GetRun %s: %v", sink.runID(id), err)
	}
	if conversation && run.Sandbox == "" {
		b.Fatalf("run %s of %s did not run in a conversation sandbox: %s", run.ID, agent, run.SandboxNote)
	}
	m.run = append(m.run, run.FinishedAt.Sub(run.StartedAt))
	m.runIDs = append(m.runIDs, run.ID)
}

func benchRuns() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_E2E_RUNS")); err == nil && v > 1 {
		return v / 2
	}
	return 30
}

// BenchmarkConversationSandbox: the second and later messages of one
// conversation (its sandbox alive, the local provider answering "ping"),
// each beside a message of the same backend in a fresh sandbox (scope
// "message"), alternately in the same run, through the real daemons:
// POST → reply and the run itself (started → finished). Idle memory is the
// RSS of every process of the conversation's sandbox and of its egress
// proxy, after the runs.
func BenchmarkConversationSandbox(b *testing.B) {
	withContainers := os.Getenv("BENCH_SANDBOX_BACKENDS") != "landlock"
	var cli *client.Client
	if withContainers {
		cli = testdocker.Engine(b)
	}
	st, sink := sandboxStack(b, withContainers)
	conn, err := st.Conn()
	if err != nil {
		b.Fatalf("cannot connect to the suite's bus: %v", err)
	}
	b.Cleanup(func() { conn.Close() })
	sched := busapi.NewScheduler(conn)
	backends := []struct{ name, perMessage, conversation string }{{"landlock", "msg", "conv"}}
	if withContainers {
		backends = append(backends, struct{ name, perMessage, conversation string }{"container", "cmsg", "cconv"})
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			var fresh, kept sandboxMeasure
			// Warm up: the scheduler's activation, the image, the first
			// message of the conversation (it starts the sandbox).
			fresh.ask(b, st, sched, sink, be.perMessage, "", false)
			kept.ask(b, st, sched, sink, be.conversation, "t-"+be.name, true)
			fresh, kept = sandboxMeasure{}, sandboxMeasure{}
			for range benchRuns() {
				kept.ask(b, st, sched, sink, be.conversation, "t-"+be.name, true)
				fresh.ask(b, st, sched, sink, be.perMessage, "", false)
				if be.name == "container" {
					// The fresh container is removed after its reply; the next
					// message is measured on an engine that is done with it.
					containersGone(b, cli, boxes.LabelAgent+"="+be.perMessage)
				}
			}
			keepLogs(b, st)
			sink.failures(b)
			b.ReportMetric(ms(quantile(kept.run, 0.5)), "kept_run_p50_ms")
			b.ReportMetric(ms(quantile(kept.run, 0.95)), "kept_run_p95_ms")
			b.ReportMetric(ms(quantile(kept.postToReply, 0.5)), "kept_reply_p50_ms")
			b.ReportMetric(ms(quantile(kept.postToReply, 0.95)), "kept_reply_p95_ms")
			b.ReportMetric(ms(quantile(fresh.run, 0.5)), "msg_run_p50_ms")
			b.ReportMetric(ms(quantile(fresh.postToReply, 0.5)), "msg_reply_p50_ms")
			b.ReportMetric(ms(quantile(fresh.postToReply, 0.95)), "msg_reply_p95_ms")
			b.ReportMetric(float64(quantile(kept.postToReply, 0.5))/float64(quantile(fresh.postToReply, 0.5)), "reply_kept/msg")

			sbx := sandboxOf(b, sched, be.conversation, "t-"+be.name)
			rss, _ := sandboxRSS(b, cli, sbx, false)
			b.ReportMetric(mib(rss.pss), "idle_sandbox_pss_MiB")
			b.ReportMetric(mib(rss.rss), "idle_sandbox_rss_MiB")
			b.ReportMetric(mib(sbx.MemoryBytes), "idle_sandbox_listed_MiB")
			// The same with an egress proxy, after two messages.
			postAndWait(b, st, sched, sink, be.conversation+"net", "t-net")
			postAndWait(b, st, sched, sink, be.conversation+"net", "t-net")
			rss, proxy := sandboxRSS(b, cli, sandboxOf(b, sched, be.conversation+"net", "t-net"), true)
			b.ReportMetric(mib(rss.pss+proxy.pss), "idle_with_proxy_pss_MiB")
			b.ReportMetric(mib(proxy.pss), "idle_proxy_pss_MiB")
			b.ReportMetric(mib(proxy.rss), "idle_proxy_rss_MiB")
		})
	}
	b.Run("fifty-idle", func(b *testing.B) {
		var before, beside sandboxMeasure
		for range benchRuns() {
			before.ask(b, st, sched, sink, "msg", "", false)
		}
		// The scheduler's CPU for as many runs without the 50 beside them.
		cpuStart := idleCPU(b, st, nil)
		for range benchRuns() {
			before.ask(b, st, sched, sink, "msg", "", false)
		}
		cpuEnd := idleCPU(b, st, nil)
		threads0, rss0 := schedulerThreads(b, st)
		mounts0 := hostMounts(b)
		for i := range 50 {
			postAndWait(b, st, sched, sink, "conv", fmt.Sprintf("idle-%d", i))
		}
		list, err := sched.ListSandboxes(context.Background(), "conv")
		if err != nil {
			b.Fatalf("cannot list the sandboxes: %v", err)
		}
		if len(list) < 50 {
			b.Fatalf("%d sandboxes of conv alive, want 50 idle ones and more", len(list))
		}
		cpuBefore := idleCPU(b, st, list)
		threads50, rss50 := schedulerThreads(b, st)
		mounts50 := hostMounts(b)
		for range benchRuns() {
			beside.ask(b, st, sched, sink, "msg", "", false)
		}
		cpuAfter := idleCPU(b, st, list)
		sink.failures(b)
		var total memory
		for _, s := range list {
			r, _ := sandboxRSS(b, nil, s, false)
			total.rss, total.pss = total.rss+r.rss, total.pss+r.pss
		}
		b.ReportMetric(ms(quantile(before.postToReply, 0.5)), "msg_reply_p50_ms")
		b.ReportMetric(ms(quantile(before.run, 0.5)), "msg_run_p50_ms")
		b.ReportMetric(ms(quantile(beside.postToReply, 0.5)), "beside_50_reply_p50_ms")
		b.ReportMetric(ms(quantile(beside.postToReply, 0.95)), "beside_50_reply_p95_ms")
		b.ReportMetric(ms(quantile(beside.run, 0.5)), "beside_50_run_p50_ms")
		// Where in the run the 50 cost: before the agent is confined (the
		// scheduler's setup and the agent's start) or after.
		toConfined, toEnd := runSplit(b, st, before.runIDs)
		toConfined50, toEnd50 := runSplit(b, st, beside.runIDs)
		b.ReportMetric(ms(quantile(toConfined, 0.5)), "start_to_confined_p50_ms")
		b.ReportMetric(ms(quantile(toEnd, 0.5)), "confined_to_end_p50_ms")
		b.ReportMetric(ms(quantile(toConfined50, 0.5)), "beside_50_start_to_confined_p50_ms")
		b.ReportMetric(ms(quantile(toEnd50, 0.5)), "beside_50_confined_to_end_p50_ms")
		b.ReportMetric(mib(total.rss), "sandboxes_rss_MiB")
		b.ReportMetric(mib(total.pss), "sandboxes_pss_MiB")
		for who, d := range cpuAfter.minus(cpuBefore) {
			b.ReportMetric(ms(d), "beside_50_cpu_"+who+"_ms")
		}
		b.ReportMetric(ms(cpuEnd.minus(cpuStart)["scheduler"]), "alone_cpu_scheduler_ms")
		// A kept host sandbox holds one locked OS thread of the scheduler
		// (its agent's wait) for its life: idle, it costs memory, no CPU.
		b.ReportMetric(float64(mounts0), "alone_host_mounts")
		b.ReportMetric(float64(mounts50), "beside_50_host_mounts")
		b.ReportMetric(float64(threads0), "alone_scheduler_threads")
		b.ReportMetric(float64(threads50), "beside_50_scheduler_threads")
		b.ReportMetric(mib(rss0), "alone_scheduler_rss_MiB")
		b.ReportMetric(mib(rss50), "beside_50_scheduler_rss_MiB")
	})
}

// containersGone waits until no container has label.
func containersGone(b *testing.B, cli *client.Client, label string) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for len(containersLabelled(b, cli, label)) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("containers labelled %s are still there after 2 minutes", label)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// postAndWait asks agent once in thread and fails unless it succeeded.
func postAndWait(b *testing.B, st *devstack.Stack, sched busapi.Scheduler, sink *fastSink, agent, thread string) {
	b.Helper()
	var m sandboxMeasure
	m.ask(b, st, sched, sink, agent, thread, true)
}

// sandboxOf is agent's live sandbox of thread.
func sandboxOf(b *testing.B, sched busapi.Scheduler, agent, thread string) busapi.Sandbox {
	b.Helper()
	list, err := sched.ListSandboxes(context.Background(), agent)
	if err != nil {
		b.Fatalf("cannot list the sandboxes: %v", err)
	}
	for _, s := range list {
		if s.Thread == thread {
			return s
		}
	}
	b.Fatalf("no sandbox of %s for thread %s in %d listed", agent, thread, len(list))
	return busapi.Sandbox{}
}

// memory is what processes hold: RSS counts the pages they share with
// others (berth-agent's binary) in full, PSS only their share.
type memory struct{ rss, pss int64 }

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// sandboxRSS is the memory of every process of sandbox s (those whose
// cgroup path names it, or its container's) and, when withProxy, of its
// egress proxy (the berth-egress listening on a socket whose path names it).
func sandboxRSS(b *testing.B, cli *client.Client, s busapi.Sandbox, withProxy bool) (sandbox, proxy memory) {
	b.Helper()
	mark := s.ID
	if s.Backend == "container" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", boxes.LabelRun+"="+s.ID)})
		if err != nil || len(list.Items) != 1 {
			b.Fatalf("cannot find the container of sandbox %s: %v", s.ID, err)
		}
		mark = list.Items[0].ID
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
		if err != nil {
			continue
		}
		// A host run's proxy may share the sandbox's cgroup name; a
		// container's listens on a socket under the scheduler's state.
		if isProxyOf(p, cg, s.ID) {
			proxy.add(memoryOf(p))
		} else if bytes.Contains(cg, []byte(mark)) {
			sandbox.add(memoryOf(p))
		}
	}
	if sandbox.rss == 0 {
		b.Fatalf("no process of sandbox %s found", s.ID)
	}
	if withProxy && proxy.rss == 0 {
		b.Fatalf("no egress proxy of sandbox %s found", s.ID)
	}
	return sandbox, proxy
}

func (m *memory) add(o memory) { m.rss, m.pss = m.rss+o.rss, m.pss+o.pss }

// isProxyOf says whether process proc (of cgroup cg) is the egress proxy of
// sandbox id.
func isProxyOf(proc string, cg []byte, id string) bool {
	comm, _ := os.ReadFile(filepath.Join(proc, "comm"))
	if strings.TrimSpace(string(comm)) != "berth-egress" {
		return false
	}
	return bytes.Contains(cg, []byte(id)) || listensOn(proc, id)
}

// listensOn says whether process proc has a unix socket open whose path
// names part. It reads the process's own /proc/<pid>/net/unix: a host
// run's proxy is in a network namespace of its own.
func listensOn(proc, part string) bool {
	f, err := os.Open(filepath.Join(proc, "net", "unix"))
	if err != nil {
		return false
	}
	defer f.Close()
	inodes := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && strings.Contains(fields[7], part) {
			inodes[fields[6]] = true
		}
	}
	if len(inodes) == 0 {
		return false
	}
	fds, _ := filepath.Glob(filepath.Join(proc, "fd", "*"))
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		if err == nil && strings.HasPrefix(link, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			return true
		}
	}
	return false
}

// memoryOf is a process's Rss and Pss (zero when it is gone or a kernel
// thread).
func memoryOf(proc string) memory {
	rollup, err := os.ReadFile(filepath.Join(proc, "smaps_rollup"))
	if err != nil {
		return memory{}
	}
	var m memory
	for line := range strings.Lines(string(rollup)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		switch name {
		case "Rss":
			m.rss = kb << 10
		case "Pss":
			m.pss = kb << 10
		}
	}
	return m
}

// cpuTimes is the CPU (user + system) used so far by the scheduler, the idle
// sandboxes' processes and their egress proxies.
type cpuTimes map[string]time.Duration

func (c cpuTimes) minus(o cpuTimes) cpuTimes {
	d := cpuTimes{}
	for k, v := range c {
		d[k] = v - o[k]
	}
	return d
}

// idleCPU reads what the scheduler, the sandboxes in list and their proxies
// have used of the CPU: whether idle sandboxes cost the machine anything
// while other runs go on.
func idleCPU(b *testing.B, st *devstack.Stack, list []busapi.Sandbox) cpuTimes {
	b.Helper()
	out := cpuTimes{}
	if pid, err := st.ServicePID(bus.SchedulerName); err == nil && pid > 0 {
		out["scheduler"] = cpuOf(fmt.Sprintf("/proc/%d", pid))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, s := range list {
		for _, p := range procs {
			cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
			if err != nil {
				continue
			}
			if isProxyOf(p, cg, s.ID) {
				out["idle_proxies"] += cpuOf(p)
			} else if bytes.Contains(cg, []byte(s.ID)) {
				out["idle_sandboxes"] += cpuOf(p)
			}
		}
	}
	return out
}

// hostMounts is the number of mounts in this process's mount namespace (the
// host's): each new run's mount namespace starts as a copy of it.
func hostMounts(b *testing.B) int {
	b.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		b.Fatalf("cannot read the mounts: %v", err)
	}
	return bytes.Count(info, []byte("\n"))
}

// schedulerThreads is the scheduler's number of OS threads and its RSS.
func schedulerThreads(b *testing.B, st *devstack.Stack) (threads int, rss int64) {
	b.Helper()
	pid, err := st.ServicePID(bus.SchedulerName)
	if err != nil || pid == 0 {
		b.Fatalf("cannot find the scheduler's process: %v", err)
	}
	proc := fmt.Sprintf("/proc/%d", pid)
	status, err := os.ReadFile(filepath.Join(proc, "status"))
	if err != nil {
		b.Fatalf("cannot read the scheduler's status: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(rest))
		}
	}
	return threads, memoryOf(proc).rss
}

// cpuOf is a process's utime + stime, at the kernel's 100 ticks a second.
func cpuOf(proc string) time.Duration {
	stat, err := os.ReadFile(filepath.Join(proc, "stat"))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: state is the first,
	// utime and stime the 12th and 13th.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}
