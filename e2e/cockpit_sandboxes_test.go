package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The Cockpit page's Sandboxes and Schedules views (issues 22 and 25), in
// a real browser against real Cockpit and the real services.

// A thread id as a platform may spell it: markup and quotes that must show
// as text, and spaces that must stay.
const oddThread = `t <b>1</b> & "two  spaces"`

// sandboxSuite is a suite with a conversation-scoped agent "kept" (Landlock,
// the local provider, an idle stop no test reaches) and a job "nightly" of
// agent ops whose calendar never comes due while a test runs.
func sandboxSuite(t *testing.T) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	agents := []agentSpec{
		{id: "ops"},
		{id: "kept", extra: "[agents.sandbox]\nscope = \"conversation\"\nidle_stop = \"1h\""},
	}
	sink := newReplySink(t)
	cfg := suiteConfig(agents, sink.srv.URL+"/replies") + `
[[schedules]]
id = "nightly"
agent = "ops"
on_calendar = "2099-06-01 09:00 UTC"
prompt = "nightly summary"
deliver_to = { connector = "hooks", channel = "ops" }
`
	s := launch(t, sink, cfg, nil, secret)
	stopImaged(t, s)
	return s
}

func jsSandboxRow(id string) string {
	return `document.querySelector('#sandboxes-table tr[data-sandbox-id=` + strconv.Quote(id) + `]')`
}

func jsScheduleRow(id string) string {
	return `document.querySelector('#schedules-table tr[data-schedule-id=` + strconv.Quote(id) + `]')`
}

func TestCockpitAsAnAdminShowsConversationSandboxesLiveAndStopsOne(t *testing.T) {
	s := sandboxSuite(t)
	sched := s.scheduler(t)
	c := openCockpit(t, s, "")
	c.open("/sandboxes")
	c.waitFor(live, `document.getElementById("sandboxes-empty").hidden === false`)

	reply := s.ask(t, "kept", oddThread, "hello sandbox")
	if reply["state"] != "succeeded" {
		t.Fatalf("the kept agent's run: state %v, error %v", reply["state"], reply["error"])
	}
	sandbox := s.runRecord(t, reply).Sandbox
	if sandbox == "" {
		t.Fatal("the conversation-scoped agent's run names no sandbox")
	}

	// The row comes from SandboxesChanged, without reload, once the run is over.
	row := jsSandboxRow(sandbox)
	c.waitFor(live, row+`?.dataset.busy === "false"`)
	c.noReload()
	cell := func(label string) string {
		return evalString(c, row+`.querySelector('[data-label=`+strconv.Quote(label)+`]').textContent`)
	}
	for label, want := range map[string]string{"Agent": "kept", "Connector": "hooks", "Channel": "kept", "Thread": oddThread, "Backend": "landlock", "Runs": "1"} {
		if got := cell(label); got != want {
			t.Errorf("the sandbox's %s shows as %q, want %q", label, got, want)
		}
	}
	if got := evalString(c, `String(`+row+`.querySelectorAll("b").length)`); got != "0" {
		t.Errorf("the thread's markup became %s elements on the page", got)
	}
	for _, label := range []string{"Started", "Last activity", "Idle for", "Memory"} {
		if got := cell(label); got == "" || got == "—" {
			t.Errorf("the sandbox's %s shows as %q", label, got)
		}
	}
	c.screenshot("cockpit-sandboxes.png")

	// Stop: the row leaves, live, and the scheduler has it no more.
	c.waitFor(live, row+`?.querySelector('button[data-stop]')?.disabled === false`)
	c.eval(row + `.querySelector('button[data-stop]').click()`)
	c.waitFor(live, `!`+row+` && document.getElementById("sandboxes-done").textContent.includes(`+strconv.Quote(sandbox)+`)`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := sched.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	if slices.ContainsFunc(list, func(sb busapi.Sandbox) bool { return sb.ID == sandbox }) {
		t.Errorf("after Stop the scheduler still lists %s: %+v", sandbox, list)
	}
	c.noReload()
}

func TestCockpitAsAnAdminShowsSchedulesWithTheirNextRunAndRunsOneNow(t *testing.T) {
	s := sandboxSuite(t)
	sched := s.scheduler(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := openCockpit(t, s, "")
	c.open("/schedules")

	row := jsScheduleRow("nightly")
	c.waitFor(live, `!!`+row)
	jobs, err := sched.ListSchedules(ctx)
	if err != nil || len(jobs) != 1 || jobs[0].Next.IsZero() {
		t.Fatalf("ListSchedules = %+v, %v; want nightly with a next run", jobs, err)
	}
	cell := func(label string) string {
		return evalString(c, row+`.querySelector('[data-label=`+strconv.Quote(label)+`]').textContent`)
	}
	next := evalString(c, `new Date(`+strconv.FormatInt(jobs[0].Next.UnixMilli(), 10)+`).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" })`)
	for label, want := range map[string]string{"Agent": "ops", "Calendar": jobs[0].OnCalendar, "Destination": "hooks / ops", "Next run": next, "Last run": "never"} {
		if got := cell(label); got != want {
			t.Errorf("the schedule's %s shows as %q, want %q", label, got, want)
		}
	}

	// Run now fires a run: the runs list gets it, and the job's last state
	// follows it without reload.
	c.waitFor(live, row+`?.querySelector('button[data-run-schedule]')?.disabled === false`)
	c.eval(row + `.querySelector('button[data-run-schedule]').click()`)
	c.waitFor(live, `document.getElementById("schedules-done").textContent === "Run now of nightly: started."`)
	c.waitFor(live, row+`?.dataset.lastState === "succeeded"`)
	if got := cell("Last run"); got == "never" {
		t.Errorf("after Run now the schedule's last run shows as %q", got)
	}
	var runID string
	for _, r := range s.listRuns(t, busapi.ListFilter{Agent: "ops"}) {
		if strings.Contains(r.MessageID, "schedule:nightly:") {
			runID = r.ID
		}
	}
	if runID == "" {
		t.Fatal("Run now made no run of the nightly job")
	}
	c.noReload()
	c.screenshot("cockpit-schedules.png")
	c.goTo("/runs")
	c.waitFor(live, jsRow(runID)+`?.dataset.state === "succeeded"`)
	c.waitFor(live, jsRow(runID)+`?.textContent.includes("nightly summary")`)
	// The row says which job fired it.
	if got := evalString(c, jsRow(runID)+`.querySelector('[data-label="Agent"] [data-schedule]')?.textContent ?? ""`); got != "schedule nightly" {
		t.Errorf("the scheduled run's row names its job as %q, want %q", got, "schedule nightly")
	}
}

// berth's policy lets only root and berth-admin list sandboxes and jobs:
// for anyone else both views say so with the bus's refusal, and nothing of
// a live conversation reaches the page.
func TestCockpitForAUserThePolicyRefusesShowsTheRefusalForSandboxesAndSchedules(t *testing.T) {
	s := sandboxSuite(t)
	reply := s.ask(t, "kept", oddThread, "hello sandbox")
	sandbox := s.runRecord(t, reply).Sandbox
	if reply["state"] != "succeeded" || sandbox == "" {
		t.Fatalf("the kept agent's run: state %v, error %v, sandbox %q", reply["state"], reply["error"], sandbox)
	}
	c := openCockpit(t, s, "nobody")
	c.open("/sandboxes")
	c.waitFor(live, `document.getElementById("sandboxes-error").textContent.includes("org.freedesktop.DBus.Error.AccessDenied")`)
	c.waitFor(live, `document.getElementById("sandboxes-error").textContent.includes("berth-admin")`)
	if got := evalString(c, `String(document.querySelectorAll("#sandboxes-table tbody tr").length)`); got != "0" {
		t.Errorf("a refused user sees %s sandbox rows", got)
	}
	if html := evalString(c, `document.documentElement.outerHTML`); strings.Contains(html, "two  spaces") || strings.Contains(html, sandbox) {
		t.Error("the conversation's sandbox reached a user who may not list it")
	}
	c.screenshot("cockpit-sandboxes-refused.png")

	c.goTo("/schedules")
	c.waitFor(live, `document.getElementById("schedules-error").textContent.includes("org.freedesktop.DBus.Error.AccessDenied")`)
	c.waitFor(live, `document.getElementById("schedules-error").textContent.includes("berth-admin")`)
	if got := evalString(c, `String(document.querySelectorAll("#schedules-table tbody tr").length)`); got != "0" {
		t.Errorf("a refused user sees %s schedule rows", got)
	}

	// The refused page stopped nothing: the sandbox still lives.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := s.scheduler(t).ListSandboxes(ctx, "kept")
	if err != nil || !slices.ContainsFunc(list, func(sb busapi.Sandbox) bool { return sb.ID == sandbox }) {
		t.Errorf("after a refused user's page the scheduler lists %+v, %v; want %s", list, err, sandbox)
	}
	c.noReload()
}
