package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/cockpittest"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The Cockpit page in a real browser against real Cockpit: Debian's
// cockpit-ws with a local cockpit-bridge session whose system bus is the
// suite's private bus, the real services on it, Chromium headless. An admin
// (root) and a user berth's D-Bus policy refuses (nobody) each get their own
// cockpit-ws and bridge.

// cockpitPackageDir is the repository's cockpit/ directory.
func cockpitPackageDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "cockpit")
}

// Within one refresh period of the page (10 s): what appears sooner came from
// a signal, not from the page's slow safety-net timer or a reload.
const live = 9 * time.Second

type cockpitSession struct {
	t  *testing.T
	cs *cockpittest.Server
	b  *cockpittest.Browser
}

func openCockpit(t *testing.T, s *suite, user string) *cockpitSession {
	t.Helper()
	progs := cockpittest.NeedCockpit(t)
	chromium := cockpittest.NeedChromium(t)
	dir, err := os.MkdirTemp(baseDir, "cockpit-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	cs := cockpittest.Start(t, progs, cockpittest.Options{
		BusAddress: s.Bus.Address,
		PackageDir: cockpitPackageDir(),
		User:       user,
		Dir:        dir,
	})
	b := cockpittest.NewBrowser(t, chromium, 1280, 900)
	return &cockpitSession{t: t, cs: cs, b: b}
}

// open loads the page at fragment and waits until its first refresh is done.
func (c *cockpitSession) open(fragment string) {
	c.t.Helper()
	if err := c.b.Do(30*time.Second, chromedp.Navigate(c.cs.PageURL(fragment))); err != nil {
		c.t.Fatalf("cannot open the page: %v", err)
	}
	c.waitFor(20*time.Second, `document.body.dataset.ready === "true"`)
	// A reload would drop this mark: checked by the tests that say "without reload".
	c.eval(`window.berthNoReload = true`)
}

func (c *cockpitSession) waitFor(timeout time.Duration, expr string) {
	c.t.Helper()
	if err := c.b.WaitFor(timeout, expr); err != nil {
		text, _ := cockpittest.Eval[string](c.b, 5*time.Second, `document.body.innerText`)
		c.t.Fatalf("%v\nthe page shows:\n%s", err, text)
	}
}

func (c *cockpitSession) eval(expr string) {
	c.t.Helper()
	if _, err := cockpittest.Eval[any](c.b, 10*time.Second, expr); err != nil {
		c.t.Fatalf("cannot evaluate %s: %v", expr, err)
	}
}

func evalString(c *cockpitSession, expr string) string {
	c.t.Helper()
	v, err := cockpittest.Eval[string](c.b, 10*time.Second, expr)
	if err != nil {
		c.t.Fatalf("cannot evaluate %s: %v", expr, err)
	}
	return v
}

// go switches the page's location the way a click on a link does.
func (c *cockpitSession) goTo(fragment string) {
	c.t.Helper()
	c.eval(`window.location.hash = ` + strconv.Quote(fragment))
}

func (c *cockpitSession) noReload() {
	c.t.Helper()
	if evalString(c, `String(window.berthNoReload === true)`) != "true" {
		c.t.Fatal("the page reloaded; it must update live")
	}
}

// shellScreenshot opens the page inside Cockpit's shell, as a user sees it,
// waits until the page's frame shows ready (and then what frameWants says,
// a JS expression on the frame's document "d"), and saves it: the README's
// screenshots come from here. It leaves the tab in the shell: call open to
// go on with the page alone.
func (c *cockpitSession) shellScreenshot(fragment, frameWants, name string) {
	c.t.Helper()
	testenv.Need(c.t, cockpittest.HasShell(), "Cockpit's shell is not installed (apt-get install cockpit-system)")
	// From a blank page, so the shell loads afresh at fragment.
	if err := c.b.Do(10*time.Second, chromedp.Navigate("about:blank")); err != nil {
		c.t.Fatalf("cannot leave the page: %v", err)
	}
	// The shell loads Cockpit's whole UI: on a busy two-core machine that can
	// take more than half a minute.
	if err := c.b.Go(90*time.Second, c.cs.ShellURL(fragment)); err != nil {
		c.t.Fatalf("cannot open Cockpit's shell: %v", err)
	}
	want := `(() => { const f = document.querySelector('iframe[name$="/berth"]'); const d = f && f.contentDocument;
		return !!(d && d.body && d.body.dataset.ready === "true" && (` + frameWants + `)); })()`
	if err := c.b.WaitFor(60*time.Second, want); err != nil {
		text, _ := cockpittest.Eval[string](c.b, 5*time.Second, `document.body.innerText`)
		c.t.Fatalf("%v\nthe shell shows:\n%s", err, text)
	}
	c.screenshot(name)
}

func (c *cockpitSession) screenshot(name string) {
	c.t.Helper()
	path := filepath.Join(c.t.ArtifactDir(), name)
	if err := c.b.Screenshot(path); err != nil {
		c.t.Errorf("cannot save a screenshot: %v", err)
		return
	}
	c.t.Logf("screenshot: %s", path)
}

// jsRow is a JS expression for the row of a run in the runs table.
func jsRow(runID string) string {
	return `document.querySelector('#runs-table tr[data-run-id=` + strconv.Quote(runID) + `]')`
}

// runIDOf waits until the scheduler has a run for a message id.
func (s *suite) runIDOf(t *testing.T, messageID string) string {
	t.Helper()
	sched := s.scheduler(t)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		runs, err := sched.ListRuns(context.Background(), busapi.ListFilter{Limit: 50})
		if err != nil {
			t.Fatalf("ListRuns: %v", err)
		}
		for _, r := range runs {
			// The scheduler's message id is intake's key: connector/id.
			if r.MessageID == messageID || r.MessageID == busapi.MessageKey("hooks", messageID) {
				return r.ID
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no run for message %s", messageID)
	return ""
}

func cockpitAgents() []agentSpec {
	return []agentSpec{{id: "ops"}, {id: "helper"}}
}

func TestCockpitPageAsAnAdminShowsLiveCountsRunsAndRepliesAndMayCancel(t *testing.T) {
	s := start(t, cockpitAgents())
	stopImaged(t, s)
	c := openCockpit(t, s, "") // root: berth's policy admits it
	c.open("/")

	// Overview: no systemd on this bus, said plainly; the services' presence
	// on the bus instead.
	c.waitFor(live, `document.querySelector('#units-table [data-unit="berth-scheduler.service"] .berth-unit-state').textContent === "systemd not available"`)
	c.waitFor(live, `document.getElementById("intake-presence").textContent === "berth-intake is running."`)

	// A long run and one queued behind it show in the counts, live.
	long := s.mustPost(t, "ops", "/sh sleep 60")
	longRun := s.runIDOf(t, long)
	c.waitFor(live, `document.getElementById("running").dataset.value === "1"`)
	queued := s.mustPost(t, "ops", "queued behind the long one")
	c.waitFor(live, `document.getElementById("queue-depth").dataset.value === "1"`)
	c.noReload()
	c.screenshot("cockpit-page-overview.png")

	// The runs list shows the running run with Cancel enabled.
	c.goTo("/runs")
	c.waitFor(live, jsRow(longRun)+`?.dataset.state === "running"`)
	c.waitFor(live, jsRow(longRun)+`?.querySelector('button[data-cancel]')?.disabled === false`)

	// A new message appears in the list without reload, and finishes there.
	hello := s.mustPost(t, "helper", "hello from cockpit")
	helloRun := s.runIDOf(t, hello)
	c.waitFor(live, jsRow(helloRun)+`?.dataset.state === "succeeded"`)
	c.waitFor(live, jsRow(helloRun)+`?.textContent.includes("hello from cockpit")`)
	c.noReload()
	c.screenshot("cockpit-page-runs.png")

	// The same inside Cockpit's own frame, as an admin opens it.
	c.shellScreenshot("/", `d.getElementById("running").dataset.value === "1" && d.getElementById("queue-depth").dataset.value === "1"`, "cockpit-overview.png")
	c.shellScreenshot("/runs", `!!d.querySelector('#runs-table tr[data-run-id=`+strconv.Quote(helloRun)+`][data-state="succeeded"]')`, "cockpit-runs.png")

	// Its detail shows the message and the agent's reply.
	c.open("/runs/" + helloRun)
	c.waitFor(live, `document.getElementById("run-reply").textContent.includes("you said: hello from cockpit")`)
	if got := evalString(c, `document.getElementById("run-text").textContent`); got != "hello from cockpit" {
		t.Errorf("the run's message shows as %q", got)
	}
	if got := evalString(c, `document.querySelector('#run-fields [data-field="Agent"] dd').textContent`); got != "helper" {
		t.Errorf("the run's agent shows as %q", got)
	}
	c.screenshot("cockpit-run.png")

	// A run with a tool call shows the tool and its arguments.
	tool := s.mustPost(t, "helper", "/sh echo shown-in-cockpit")
	toolRun := s.runIDOf(t, tool)
	c.goTo("/runs/" + toolRun)
	c.waitFor(live, `document.querySelector('#run-tools tbody th')?.textContent === "shell"`)
	if args := evalString(c, `document.querySelector('#run-tools tbody td[data-label="Arguments"]').textContent`); !strings.Contains(args, "echo shown-in-cockpit") {
		t.Errorf("the shell call's arguments show as %q", args)
	}
	c.waitFor(live, `document.getElementById("run-reply").textContent.includes("shown-in-cockpit")`)
	// An offline agent sent nothing through the egress proxy, and says so.
	c.waitFor(live, `document.getElementById("run-egress-empty").hidden === false && document.getElementById("run-egress").hidden === true`)

	// Cancel from the list: the run ends canceled, live, and the queued
	// message runs next.
	c.goTo("/runs")
	c.waitFor(live, jsRow(longRun)+`?.querySelector('button[data-cancel]')?.disabled === false`)
	c.eval(jsRow(longRun) + `.querySelector('button[data-cancel]').click()`)
	c.waitFor(live, jsRow(longRun)+`?.dataset.state === "canceled"`)
	queuedRun := s.runIDOf(t, queued)
	c.waitFor(20*time.Second, jsRow(queuedRun)+`?.dataset.state === "succeeded"`)
	c.goTo("/")
	c.waitFor(live, `document.getElementById("running").dataset.value === "0" && document.getElementById("queue-depth").dataset.value === "0"`)
	c.noReload()

	// Agents: the scheduler's own plan, readable.
	c.goTo("/agents")
	c.waitFor(live, `!!document.querySelector('#agents-list [data-agent="ops"] button')`)
	c.eval(`document.querySelector('#agents-list [data-agent="ops"] button').click()`)
	c.waitFor(live, `document.querySelector('#agents-list [data-agent="ops"]').textContent.includes("Backend")`)
	if got := evalString(c, `document.querySelector('#agents-list [data-agent="ops"]').textContent`); !strings.Contains(got, "landlock") {
		t.Errorf("the ops agent's plan does not name its landlock backend:\n%s", got)
	}
	c.screenshot("cockpit-agents.png")

	// No secret reaches the page or Cockpit's log.
	for _, view := range []string{"/", "/runs", "/agents"} {
		c.goTo(view)
		c.waitFor(live, `document.body.dataset.view === `+strconv.Quote(strings.Trim(view, "/")+map[bool]string{true: "overview"}[view == "/"]))
		if strings.Contains(evalString(c, `document.documentElement.outerHTML`), secret) {
			t.Errorf("the webhook secret is on the page at %s", view)
		}
	}
	if b, _ := os.ReadFile(c.cs.LogPath); strings.Contains(string(b), secret) {
		t.Errorf("the webhook secret is in %s", c.cs.LogPath)
	}
}

func TestCockpitPageForAUserThePolicyRefusesDisablesAdminActionsAndShowsTheRefusal(t *testing.T) {
	s := start(t, cockpitAgents())
	stopImaged(t, s)
	c := openCockpit(t, s, "nobody")
	c.open("/runs")

	// Counts are public: the overview works for everyone.
	c.waitFor(live, `document.getElementById("access-notice").hidden === false`)
	c.waitFor(live, `document.getElementById("access-error").textContent.includes("Rejected send message")`)

	// Listing runs is refused, and the page says so with the bus's error.
	c.waitFor(live, `document.getElementById("runs-error").textContent.includes("org.freedesktop.DBus.Error.AccessDenied")`)
	c.waitFor(live, `document.getElementById("runs-error").textContent.includes("berth-admin")`)

	// A run still shows up live (signals reach everyone), without its texts,
	// and its Cancel is disabled with the reason as a tooltip.
	long := s.mustPost(t, "ops", "/sh sleep 60")
	longRun := s.runIDOf(t, long)
	t.Cleanup(func() {
		_ = s.scheduler(t).CancelRun(context.Background(), longRun)
	})
	c.waitFor(live, jsRow(longRun)+`?.dataset.state === "running"`)
	c.waitFor(live, jsRow(longRun)+`?.querySelector('button[data-cancel]')?.disabled === true`)
	title := evalString(c, jsRow(longRun)+`.querySelector('[data-admin-disabled]').title`)
	if !strings.Contains(title, "berth-admin") {
		t.Errorf("the disabled Cancel's tooltip is %q, want it to name berth-admin", title)
	}
	if text := evalString(c, jsRow(longRun)+`.textContent`); strings.Contains(text, "sleep") {
		t.Errorf("the run's message reached a user who may not read it: %q", text)
	}
	c.screenshot("cockpit-runs-refused.png")

	// Opening the run is a refused call too, shown with berth's bus error.
	c.eval(jsRow(longRun) + `.querySelector("a").click()`)
	c.waitFor(live, `document.getElementById("run-error").textContent.includes("AccessDenied")`)
	if got := evalString(c, `document.getElementById("run-body").hidden ? "hidden" : "shown"`); got != "hidden" {
		t.Errorf("the run's body is %s to a user who may not read it", got)
	}

	// Image builds, removals and cleaning are disabled alike.
	c.goTo("/images")
	for _, id := range []string{"build-button", "images-clean", "images-clean-all"} {
		c.waitFor(live, `document.getElementById(`+strconv.Quote(id)+`).disabled === true && document.getElementById(`+strconv.Quote(id)+`).title.includes("berth-admin")`)
	}

	// Clicking the disabled Cancel does nothing: the run still runs.
	c.goTo("/runs")
	c.waitFor(live, jsRow(longRun)+`?.dataset.state === "running"`)
	c.eval(jsRow(longRun) + `.querySelector('button[data-cancel]').click()`)
	if got := s.getRun(t, longRun).State; got != busapi.StateRunning {
		t.Errorf("after a refused user clicked Cancel the run is %s", got)
	}
	c.noReload()
}

// stopImaged ends an activated berth-imaged before the suite stops (the
// suite knows only intake and the scheduler).
func stopImaged(t *testing.T, s *suite) {
	t.Cleanup(func() {
		if pid, _ := s.ServicePID(bus.ImagesName); pid > 0 {
			_ = s.KillService(bus.ImagesName, syscall.SIGTERM)
		}
	})
}

func TestCockpitImagesPagePreviewsBuildsWithLiveProgressAndRemoves(t *testing.T) {
	testdocker.Engine(t)
	s := start(t, cockpitAgents())
	stopImaged(t, s)
	c := openCockpit(t, s, "")
	c.open("/images")

	c.waitFor(live, `document.getElementById("images-body").hidden === false && document.getElementById("images-error").hidden === true`)
	c.waitFor(live, `document.getElementById("build-button").disabled === false`)

	// The Dockerfile preview builds nothing.
	c.eval(`document.getElementById("dockerfile-button").click()`)
	c.waitFor(live, `document.getElementById("dockerfile").hidden === false && document.getElementById("dockerfile").textContent.includes("FROM")`)

	// Build: progress from Progress signals, to the end, and the tag. No
	// cache, so it builds even when another test's run made the image.
	c.eval(`document.getElementById("build-no-cache").checked = true`)
	c.eval(`document.getElementById("build-button").click()`)
	c.waitFor(2*time.Minute, `document.getElementById("build-status").textContent.startsWith("Built ") || document.getElementById("build-status").textContent.includes("failed")`)
	status := evalString(c, `document.getElementById("build-status").textContent`)
	if !strings.HasPrefix(status, "Built ") {
		t.Fatalf("the build says %q", status)
	}
	tag := strings.TrimPrefix(status, "Built ")
	c.waitFor(live, `document.getElementById("images-notice").textContent === "berth-imaged is running."`)
	if got := evalString(c, `(() => { const p = document.getElementById("build-progress"); return p.value === p.max && p.max > 1 ? "full" : p.value + " of " + p.max })()`); got != "full" {
		t.Errorf("the progress bar ended at %s, want it full", got)
	}
	if got := evalString(c, `document.getElementById("build-log").textContent`); got == "" {
		t.Error("the build showed no log lines")
	}
	c.waitFor(live, `!!document.querySelector('#images-table tr[data-tag=`+strconv.Quote(tag)+`]')`)
	c.screenshot("cockpit-images.png")

	// Remove: the image leaves the list.
	c.eval(`document.querySelector('#images-table tr[data-tag=` + strconv.Quote(tag) + `] button[data-remove]').click()`)
	c.waitFor(live, `document.getElementById("images-done").textContent.includes("Removed")`)
	c.waitFor(live, `!document.querySelector('#images-table tr[data-tag=`+strconv.Quote(tag)+`][data-status="ready"]') || document.querySelector('#images-table tr[data-tag=`+strconv.Quote(tag)+`]').textContent.includes("missing")`)
	c.noReload()
}

// A run's egress decisions show in its detail: the provider call the proxy
// let through, and a request it refused, with its reason.
func TestCockpitRunDetailShowsTheEgressDecisions(t *testing.T) {
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithEgress(t, claude, gpt, "")
	reply := s.ask(t, "general", "", "run curl -s --max-time 10 http://files.example/x")
	runID, _ := reply["run_id"].(string)
	if reply["state"] != "succeeded" || runID == "" {
		t.Fatalf("the egress run: state %v, error %v", reply["state"], reply["error"])
	}
	c := openCockpit(t, s, "")
	c.open("/runs/" + runID)
	c.waitFor(live, `document.getElementById("run-egress").hidden === false && document.getElementById("run-egress-empty").hidden === true`)
	c.waitFor(live, `[...document.querySelectorAll('#run-egress tbody tr')].some(r => r.textContent.includes("files.example:80") && r.textContent.includes("refused") && r.textContent.includes("no [agents.egress] allow rule matches"))`)
	c.waitFor(live, `[...document.querySelectorAll('#run-egress tbody tr')].some(r => r.textContent.includes("POST") && r.textContent.includes("allowed"))`)
}

// refusingPlatform is a webhook platform that refuses the first replies
// with 503 and then holds the next one unanswered until the test ends, so
// intake's last error for its connector stays put while the page is read.
type refusingPlatform struct {
	srv     *httptest.Server
	holding chan struct{} // closed once a reply POST is held
	release chan struct{}
}

func newRefusingPlatform(t *testing.T, refusals int) *refusingPlatform {
	p := &refusingPlatform{holding: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	posts := 0
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts++
		n := posts
		mu.Unlock()
		if n <= refusals {
			http.Error(w, "try again later", http.StatusServiceUnavailable)
			return
		}
		if n == refusals+1 {
			close(p.holding)
		}
		select {
		case <-p.release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// A connector's last error shows with when it happened, live, as intake's
// Connectors property has it; a connector without an error shows none.
func TestCockpitOverviewShowsWhenAConnectorsLastErrorHappened(t *testing.T) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	platform := newRefusingPlatform(t, 2)
	sink := newReplySink(t)
	cfg := suiteConfig(cockpitAgents(), sink.srv.URL+"/replies") +
		fmt.Sprintf("\n[[connectors]]\nid = \"refused\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n", secret, platform.srv.URL+"/replies")
	s := launch(t, sink, cfg, nil, secret)
	t.Cleanup(func() { close(platform.release) }) // before the suite stops: nothing left hanging
	stopImaged(t, s)
	c := openCockpit(t, s, "")
	c.open("/")
	cell := func(connector string) string {
		return `document.querySelector('#connectors-table tr[data-connector=` + strconv.Quote(connector) + `] td[data-label="Last error"]')`
	}
	c.waitFor(live, cell("hooks")+`?.textContent === "—"`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"id": "refused-1", "channel": "ops", "author": "tester", "text": "hello"})
	resp, err := s.Post(ctx, "refused", []byte(secret), body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST to refused: %d, want 202", resp.StatusCode)
	}
	select {
	case <-platform.holding:
	case <-ctx.Done():
		t.Fatal("intake did not retry the refused reply")
	}
	// Intake publishes a connector's status as it changes; the third POST
	// is held, so the last error then stays until the test ends.
	c.waitFor(live, `!!`+cell("refused")+`?.querySelector("time")`)
	var refused busapi.ConnectorStatus
	for _, cs := range s.intakeStatus(t).Connectors {
		if cs.ID == "refused" {
			refused = cs
		}
	}
	if !strings.Contains(refused.LastError, "503") || refused.LastErrorAt == "" {
		t.Fatalf("intake's status of refused = %+v, want its 503 with a time", refused)
	}
	if at := evalString(c, cell("refused")+`.querySelector("time").getAttribute("datetime")`); at != refused.LastErrorAt {
		t.Errorf("the refused connector's last error shows the time %q, want intake's %q", at, refused.LastErrorAt)
	}
	shown := evalString(c, cell("refused")+`.textContent`)
	when := evalString(c, `new Date(`+strconv.Quote(refused.LastErrorAt)+`).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" })`)
	if !strings.Contains(shown, refused.LastError) || !strings.Contains(shown, when) {
		t.Errorf("the refused connector's last error shows as %q, want %q at %s", shown, refused.LastError, when)
	}
	c.noReload()
}
