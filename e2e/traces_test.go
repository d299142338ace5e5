package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/otlpsink"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/internal/tracing"
)

// tracedMessage makes the agent call the shell tool, which asks the proxy
// for a host no rule allows: a model call, a tool call with an egress
// decision in it, and a second model call. traceMarker is in the text and
// in the tool's output, so that a span quoting either is caught.
const (
	traceMarker    = "trace-marker-5f3a"
	tracedMessage  = "run echo " + traceMarker + "; curl -s --max-time 10 http://files.example/" + traceMarker
	inboundTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	inboundParent  = "00f067aa0ba902b7"
)

// providerHeaders wraps the fake OpenAI server to keep each call's
// traceparent header.
func providerHeaders(t *testing.T, gpt *fakeOpenAI) func() []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	inner := gpt.srv.Config.Handler
	gpt.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
		inner.ServeHTTP(w, r)
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// One webhook message makes one trace, from intake's receive (a child of
// the sender's traceparent) through the scheduler's queue, plan, sandbox
// start and run, berth-agent's loop and calls, the proxy's decisions, to
// the reply's delivery; the run record and berthctl runs show name its
// trace id, provider calls carry its traceparent, and no span carries the
// message, the tool's output or a secret.
func TestOneMessageMakesOneTraceFromReceiveToDelivery(t *testing.T) {
	t.Parallel()
	sink := otlpsink.Start(t)
	gpt := newFakeOpenAI(t)
	traceparents := providerHeaders(t, gpt)
	s := startWithEgress(t, newFakeAnthropic(t), gpt, fmt.Sprintf("\n[tracing]\nendpoint = %q\nprovider_traceparent = true\n", sink.HTTP))

	status, id := s.postTraced(t, "00-"+inboundTraceID+"-"+inboundParent+"-01", tracedMessage)
	if status != http.StatusAccepted {
		t.Fatalf("POST: status %d", status)
	}
	reply := s.sink.wait(t, 60*time.Second, id)[id]
	if reply["state"] != "succeeded" {
		t.Fatalf("run %v: state %v, error %v", reply["run_id"], reply["state"], reply["error"])
	}
	run := s.runRecord(t, reply)
	if run.TraceID != inboundTraceID {
		t.Errorf("the run record's trace_id is %q, want the sender's trace %s", run.TraceID, inboundTraceID)
	}
	out, err := s.berthctl(t, "runs", "show", run.ID)
	if err != nil {
		t.Fatalf("berthctl runs show: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\ntrace:") || !strings.Contains(out, inboundTraceID) {
		t.Errorf("berthctl runs show prints no trace line with %s:\n%s", inboundTraceID, out)
	}

	// The run's log lines name its trace (TRACE_ID in the journal).
	if b, err := os.ReadFile(s.Bus.LogPath); err != nil || !strings.Contains(string(b), "trace_id="+inboundTraceID) {
		t.Errorf("the scheduler's log names no trace_id=%s (%v)", inboundTraceID, err)
	}

	// Every span the tree needs, the reply's send that succeeded included
	// (the reply sink refuses each reply's first POST).
	want := []string{"intake.receive", "intake.store", "intake.handoff", "scheduler.queue", "scheduler.run",
		"scheduler.plan", "sandbox.start", "agent.loop", "llm.call", "tool.call", tracing.SpanEgress,
		"scheduler.deliver", "intake.deliver"}
	spans := sink.Wait(t, 60*time.Second, func(spans []otlpsink.Span) bool {
		delivered := 0
		names := map[string]bool{}
		for _, sp := range spans {
			names[sp.Name] = true
			if sp.Name == "intake.deliver" && !sp.Failed {
				delivered++
			}
		}
		for _, n := range want {
			if !names[n] {
				return false
			}
		}
		return delivered > 0
	})

	byID := map[string]otlpsink.Span{}
	byName := map[string][]otlpsink.Span{}
	for _, sp := range spans {
		if sp.TraceID != inboundTraceID {
			t.Errorf("span %s (%s) is in trace %s, not the message's %s", sp.Name, sp.Service, sp.TraceID, inboundTraceID)
		}
		byID[sp.SpanID] = sp
		byName[sp.Name] = append(byName[sp.Name], sp)
	}
	parentName := func(sp otlpsink.Span) string {
		if sp.ParentID == inboundParent {
			return "(sender)"
		}
		return byID[sp.ParentID].Name
	}
	// Each span's parent, and the service that made it.
	tree := map[string]struct{ parent, service string }{
		"intake.receive":    {"(sender)", "berth-intake"},
		"intake.store":      {"intake.receive", "berth-intake"},
		"intake.handoff":    {"intake.store", "berth-intake"},
		"scheduler.queue":   {"intake.handoff", "berth-scheduler"},
		"scheduler.run":     {"intake.handoff", "berth-scheduler"},
		"scheduler.plan":    {"scheduler.run", "berth-scheduler"},
		"sandbox.start":     {"scheduler.run", "berth-scheduler"},
		"agent.loop":        {"scheduler.run", "berth-scheduler"},
		"llm.call":          {"agent.loop", "berth-scheduler"},
		"tool.call":         {"agent.loop", "berth-scheduler"},
		"scheduler.deliver": {"intake.handoff", "berth-scheduler"},
		"intake.deliver":    {"scheduler.deliver", "berth-intake"},
	}
	for name, w := range tree {
		for _, sp := range byName[name] {
			if got := parentName(sp); got != w.parent || sp.Service != w.service {
				t.Errorf("span %s of %s has parent %q; want parent %s of %s", name, sp.Service, got, w.parent, w.service)
			}
		}
	}
	if n := len(byName["llm.call"]); n != 2 {
		t.Errorf("%d model call spans, want 2 (the tool call, the answer)", n)
	}
	// Each decision hangs under the call whose time holds it: the provider
	// calls under the model calls, the refused curl under the tool call.
	refusedUnderTool, allowedUnderModel := 0, 0
	for _, sp := range byName[tracing.SpanEgress] {
		switch p := parentName(sp); {
		case sp.Attributes["berth.egress.verdict"] == "refused" && sp.Attributes["server.address"] == "files.example" && p == "tool.call" && sp.Failed:
			refusedUnderTool++
		case sp.Attributes["berth.egress.verdict"] == "allowed" && p == "llm.call":
			allowedUnderModel++
		default:
			t.Errorf("egress decision %v has parent %s", sp.Attributes, p)
		}
	}
	if refusedUnderTool != 1 || allowedUnderModel != 2 {
		t.Errorf("egress spans: %d refused under the tool call, %d allowed under model calls; want 1 and 2", refusedUnderTool, allowedUnderModel)
	}

	// The provider got the run span's traceparent, the proxy's, on each call.
	runSpan := byName["scheduler.run"][0]
	for _, tp := range traceparents() {
		if tp != "00-"+inboundTraceID+"-"+runSpan.SpanID+"-01" {
			t.Errorf("a provider call carried traceparent %q, want the run span's", tp)
		}
	}

	// Nothing secret or said is in a span.
	for _, sp := range spans {
		values := []string{sp.Name, sp.Error}
		for k, v := range sp.Attributes {
			values = append(values, k, v)
		}
		for _, v := range values {
			for _, bad := range []string{traceMarker, fakeKey, anthropicKey, secret, "tester"} {
				if strings.Contains(v, bad) {
					t.Errorf("span %s carries %q: %q", sp.Name, bad, v)
				}
			}
		}
	}
}

// The control: without [tracing] nothing is exported, the record names no
// trace, and the provider gets no traceparent, not even the one the
// sandbox could send (the proxy drops it). The daemons are stopped before
// the sink is read: a span left in a batch would be flushed by then.
func TestWithoutTracingNoSpanArrivesAndTheRunHasNoTrace(t *testing.T) {
	t.Parallel()
	sink := otlpsink.Start(t)
	gpt := newFakeOpenAI(t)
	traceparents := providerHeaders(t, gpt)
	s := startWithEgress(t, newFakeAnthropic(t), gpt, "")

	status, id := s.postTraced(t, "00-"+inboundTraceID+"-"+inboundParent+"-01", "run echo hi")
	if status != http.StatusAccepted {
		t.Fatalf("POST: status %d", status)
	}
	reply := s.sink.wait(t, 60*time.Second, id)[id]
	run := s.runRecord(t, reply)
	if run.TraceID != "" {
		t.Errorf("with tracing off the run record names trace %q", run.TraceID)
	}
	out, _ := s.berthctl(t, "runs", "show", run.ID)
	if strings.Contains(out, "\ntrace:") {
		t.Errorf("with tracing off berthctl runs show prints a trace line:\n%s", out)
	}
	for _, tp := range traceparents() {
		if tp != "" {
			t.Errorf("with provider_traceparent off a provider call carried traceparent %q", tp)
		}
	}
	s.stopDaemons(t)
	if spans := sink.Spans(); len(spans) != 0 {
		t.Errorf("with tracing off the receiver got %d spans: %+v", len(spans), spans)
	}
}

// postTraced posts text to channel "general" with a traceparent header.
func (s *suite) postTraced(t *testing.T, traceparent, text string) (int, string) {
	t.Helper()
	id := "m-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	body := fmt.Sprintf(`{"id":%q,"channel":"general","author":"tester","text":%q}`, id, text)
	req, err := http.NewRequest(http.MethodPost, s.IntakeURL+"/hooks/hooks", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	ts, sig := devstack.Sign([]byte(secret), time.Now(), []byte(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Berth-Timestamp", ts)
	req.Header.Set("X-Berth-Signature", sig)
	req.Header.Set("Traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, id
}

// stopDaemons ends intake and the scheduler with SIGTERM and waits for
// their processes to exit, flushing whatever spans they held.
func (s *suite) stopDaemons(t *testing.T) {
	t.Helper()
	for _, name := range []string{bus.IntakeName, bus.SchedulerName} {
		pid, err := s.ServicePID(name)
		if err != nil || pid == 0 {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatalf("cannot stop %s: %v", name, err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for !exited(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) did not exit after SIGTERM", name, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// exited reports whether pid is gone or a zombie.
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

// A fired [[schedules]] job has no message to carry a trace: it starts one
// of its own, the fire span its root, and the run's spans and its delivery
// hang under it. The run record names that trace.
func TestAScheduledRunStartsATraceOfItsOwn(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	otlp := otlpsink.Start(t)
	sink := newReplySink(t)
	cfg := suiteConfig([]agentSpec{{id: "ops"}}, sink.srv.URL+"/replies") + fmt.Sprintf(`
[tracing]
endpoint = %q

[[schedules]]
id = "nightly"
agent = "ops"
on_calendar = "2099-06-01 09:00 UTC"
prompt = "nightly summary"
deliver_to = { connector = "hooks", channel = "ops" }
`, otlp.HTTP)
	s := launch(t, sink, cfg, nil, secret)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.scheduler(t).RunSchedule(ctx, "nightly"); err != nil {
		t.Fatalf("RunSchedule: %v", err)
	}
	var runs []busapi.RunSummary
	deadline := time.Now().Add(time.Minute)
	for runs = s.listRuns(t, busapi.ListFilter{Schedule: "nightly"}); len(runs) == 0 || !s.getRun(t, runs[0].ID).Delivered; runs = s.listRuns(t, busapi.ListFilter{Schedule: "nightly"}) {
		if time.Now().After(deadline) {
			t.Fatalf("the fired job's run was not delivered within a minute: %+v", runs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	run := s.getRun(t, runs[0].ID)
	if len(run.TraceID) != 32 {
		t.Fatalf("the scheduled run's record names trace %q, want one of its own", run.TraceID)
	}
	want := []string{"scheduler.schedule.fire", "scheduler.queue", "scheduler.run", "scheduler.deliver"}
	spans := otlp.Wait(t, time.Minute, func(spans []otlpsink.Span) bool {
		names := map[string]bool{}
		for _, sp := range spans {
			if sp.TraceID == run.TraceID {
				names[sp.Name] = true
			}
		}
		for _, n := range want {
			if !names[n] {
				return false
			}
		}
		return true
	})
	byID := map[string]otlpsink.Span{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
	}
	for _, sp := range spans {
		if sp.TraceID != run.TraceID {
			continue
		}
		switch sp.Name {
		case "scheduler.schedule.fire":
			if sp.ParentID != "" || sp.Attributes["berth.schedule"] != "nightly" || sp.Attributes["berth.run_id"] != run.ID {
				t.Errorf("the fire span %+v: want a root naming the job and its run", sp)
			}
		case "scheduler.queue", "scheduler.run", "scheduler.deliver":
			if p := byID[sp.ParentID]; p.Name != "scheduler.schedule.fire" {
				t.Errorf("span %s has parent %q, want the fire span", sp.Name, p.Name)
			}
		}
	}
}

// A run whose image berth-imaged must build holds the build in its trace:
// berth-imaged's call is a child of the run's plan span (that span's id,
// sent as the call's traceparent), the build hangs under the call and its
// stages under the build; and the trace holds berth's spans only, none of
// the engine client's own HTTP spans.
func TestTraceOfARunThatBuildsItsImageHoldsBerthImagedsBuild(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := cli.ImageInspect(ctx, config.DefaultBaseImage)
	cancel()
	testenv.Need(t, err == nil, "%s is missing: run scripts/base-image.sh (%v)", config.DefaultBaseImage, err)
	// An environment of its own makes an image of its own: one to build.
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	boxed := agentSpec{id: "boxed", extra: containerAgent + fmt.Sprintf("\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }", nonce)}
	otlp := otlpsink.Start(t)
	sink := newReplySink(t)
	cfg := suiteConfig([]agentSpec{boxed}, sink.srv.URL+"/replies") + fmt.Sprintf("\n[tracing]\nendpoint = %q\n", otlp.HTTP)
	s := launch(t, sink, cfg, nil, secret)

	status, id := s.postTraced(t, "00-"+inboundTraceID+"-"+inboundParent+"-01", "/sh echo in-its-own-image")
	if status != http.StatusAccepted {
		t.Fatalf("POST: status %d", status)
	}
	reply := s.sink.wait(t, 5*time.Minute, id)[id]
	if reply["state"] != "succeeded" || !strings.Contains(text(reply), "in-its-own-image") {
		t.Fatalf("run %v: state %v, error %v, reply %q", reply["run_id"], reply["state"], reply["error"], text(reply))
	}
	want := []string{"scheduler.plan", "images.ensure", "images.resolve", "images.build", "images.check_arch",
		"images.sandbox_image", "images.isolation_image", "sandbox.start", "scheduler.deliver", "intake.deliver"}
	spans := otlp.Wait(t, time.Minute, func(spans []otlpsink.Span) bool {
		names := map[string]bool{}
		for _, sp := range spans {
			names[sp.Name] = names[sp.Name] || sp.Name != "intake.deliver" || !sp.Failed
		}
		for _, n := range want {
			if !names[n] {
				return false
			}
		}
		return true
	})
	byID := map[string]otlpsink.Span{}
	byName := map[string][]otlpsink.Span{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
		byName[sp.Name] = append(byName[sp.Name], sp)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, name := range []string{"images.isolation_image", "images.sandbox_image"} {
			for _, sp := range byName[name] {
				_, _ = cli.ImageRemove(ctx, sp.Attributes["berth.image.tag"], client.ImageRemoveOptions{PruneChildren: true})
			}
		}
	})
	if n := len(byName["scheduler.plan"]); n != 1 {
		t.Fatalf("%d plan spans, want the run's one", n)
	}
	plan := byName["scheduler.plan"][0]
	tree := map[string]string{
		"images.ensure":          "scheduler.plan",
		"images.resolve":         "images.ensure",
		"images.build":           "images.ensure",
		"images.check_arch":      "images.build",
		"images.sandbox_image":   "images.build",
		"images.isolation_image": "images.build",
	}
	for name, parent := range tree {
		for _, sp := range byName[name] {
			if sp.TraceID != inboundTraceID || sp.Service != "berth-imaged" {
				t.Errorf("span %s of %s is in trace %s; want berth-imaged's, in the message's trace %s", name, sp.Service, sp.TraceID, inboundTraceID)
			}
			if got := byID[sp.ParentID].Name; got != parent {
				t.Errorf("span %s has parent %q (%s), want %s", name, got, sp.ParentID, parent)
			}
		}
	}
	ensure := byName["images.ensure"]
	if len(ensure) != 1 || ensure[0].ParentID != plan.SpanID || ensure[0].Attributes["berth.image.outcome"] != "built" || ensure[0].Attributes["berth.agent"] != "boxed" {
		t.Errorf("berth-imaged's calls %+v: want one, the child of the run's plan span %s, that built agent boxed's image", ensure, plan.SpanID)
	}
	// berth's spans only: the engine client makes none (a span per engine
	// call would be named like "GET /v1.x/images/…/json").
	for _, sp := range spans {
		if i := strings.IndexByte(sp.Name, '.'); i < 0 || !slices.Contains([]string{"intake", "scheduler", "images", "sandbox", "agent", "llm", "tool", "egress"}, sp.Name[:i]) {
			t.Errorf("span %q of %s is not one of berth's", sp.Name, sp.Service)
		}
	}
}
