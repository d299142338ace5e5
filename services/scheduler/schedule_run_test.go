package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// queueScheduled queues job's run as a firing does, without waiting for it.
func queueScheduled(t *testing.T, s *Service, job schedules.Job, text string) Run {
	t.Helper()
	id, err := s.submitScheduled(busapi.Submission{MessageID: "schedule:" + job.ID + ":1", Agent: job.Agent, Author: "schedule:" + job.ID, Text: text}, job)
	if err != nil {
		t.Fatalf("cannot queue the job's run: %v", err)
	}
	r, err := s.GetRun(id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAScheduledJobsModelIsTheOneItsRunCallsThroughTheProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv: func(k string) string {
			if k == "OPENAI_API_KEY" {
				return egressTestKey
			}
			return ""
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	job := standup("")
	job.Model = "gpt-small"
	r := queueScheduled(t, s, job, "call the provider")
	if r.Model != "gpt-small" || r.Schedule != "standup" {
		t.Fatalf("record: model %q schedule %q, want gpt-small of standup", r.Model, r.Schedule)
	}
	res, _, err := s.runOnce(context.Background(), r, cfg)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	// The proxy lets a provider call through only with the plan's model: the
	// call was made with the job's, and allowed.
	rep := decodeReport(t, res.Result)
	if rep.ProviderStatus != 200 || !strings.Contains(rep.ProviderBody, "answer for gpt-small") {
		t.Fatalf("provider call: %d %q (proxy %q); want the answer for the job's model gpt-small", rep.ProviderStatus, rep.ProviderBody, rep.ProxyErr)
	}
	if len(res.Egress) != 1 || !res.Egress[0].Allowed {
		t.Errorf("egress decisions %+v, want the one allowed provider call", res.Egress)
	}
}

func TestAScheduledJobsMaxRuntimeEndsItsRun(t *testing.T) {
	t.Parallel()
	job := standup("sleep")
	job.MaxRuntime = 2 * time.Second // the agent's timeout is testConfig's minute
	e := newScheduledSetup(t, job, nil)
	start(t, e.s)
	began := time.Now()
	if _, err := e.s.TriggerSchedule("standup", schedules.Manual); err != nil {
		t.Fatal(err)
	}
	r := e.scheduledRun(t)
	if r.State != StateFailed || r.Reason != string(isolation.ReasonTimeout) {
		t.Fatalf("run %s: %s, want failed by timeout (max_runtime 2s)", r.State, r.Reason)
	}
	if took := time.Since(began); took > 45*time.Second {
		t.Errorf("the run ended after %s: the agent's minute, not max_runtime", took)
	}
	// The record says which limit the run had, on the bus too.
	got, err := busapi.NewScheduler(e.bus.Conn(t)).GetRun(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxRuntimeSeconds != 2 || got.Schedule != "standup" {
		t.Errorf("GetRun: schedule %q max_runtime_seconds %d, want standup and 2", got.Schedule, got.MaxRuntimeSeconds)
	}
}

func TestAScheduledRunWithOverridesTakesNoConversationSandbox(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	idle, perAgent := config.Duration(time.Minute), 2
	cfg.Agents[0].Sandbox = config.SandboxSettings{Scope: config.SandboxScopeConversation, IdleStop: &idle, MaxPerAgent: &perAgent}
	b := newGateBackend("landlock")
	s := newTestService(t, cfg, "", b, nil)
	start(t, s)

	job := standup("")
	job.Model, job.MaxRuntime = "small", 7*time.Second
	r := queueScheduled(t, s, job, "hello")
	run := b.next(t)
	if run.spec.Timeout != 7*time.Second || run.spec.Request.Provider.Model != "small" {
		t.Errorf("spec timeout %s model %q, want the job's 7s and small", run.spec.Timeout, run.spec.Request.Provider.Model)
	}
	run.reply("done")
	got := waitState(t, s, r.ID, StateSucceeded)
	// A conversation sandbox's proxy and lifetime are the agent's: the run
	// must not have been sent to one (this backend keeps none, so it would
	// have fallen back, saying so).
	if got.Sandbox != "" || got.SandboxNote != "" {
		t.Errorf("sandbox %q note %q, want a run of its own and no sandbox story", got.Sandbox, got.SandboxNote)
	}

	// A message's run of the same agent keeps the agent's model and timeout.
	id := submit(t, s, "m1", "alpha")
	run = b.next(t)
	if run.spec.Timeout != time.Minute || run.spec.Request.Provider.Model == "small" {
		t.Errorf("a message's run: timeout %s model %q, want the agent's", run.spec.Timeout, run.spec.Request.Provider.Model)
	}
	run.reply("ok")
	waitState(t, s, id, StateSucceeded)
}
