package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// The Cockpit page's Approvals view (issue 26), in a real browser against
// real Cockpit, the real services and a real run whose egress proxy holds
// a request an [agents.egress] ask rule matches.

// approvalSuite runs agent "asker", whose plain-http GETs to the returned
// upstream (host:port) wait for a person; the upstream counts what reaches it.
func approvalSuite(t *testing.T) (s *suite, host string, hits *atomic.Int32) {
	t.Helper()
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	host, hits = askedUpstream(t)
	sink := newReplySink(t)
	cfg := askerConfig(sink, fmt.Sprintf("[agents.egress]\nask = [%q]\n", "GET "+host))
	s = launch(t, sink, cfg, nil, secret)
	stopImaged(t, s)
	return s, host, hits
}

// fetchVia is a message whose run fetches http://host/path once.
func fetchVia(host, path string) string {
	return fmt.Sprintf(`/tool web_fetch {"url":"http://%s%s"}`, host, path)
}

func jsApprovalRow(table, id string) string {
	return `document.querySelector('#` + table + ` tr[data-approval-id=` + strconv.Quote(id) + `]')`
}

// approvalState is the state the scheduler has for approval id.
func approvalState(t *testing.T, s *suite, id string) busapi.Approval {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := s.scheduler(t).ListApprovals(ctx, "")
	if err != nil {
		t.Fatalf("ListApprovals: %v", err)
	}
	i := slices.IndexFunc(list, func(a busapi.Approval) bool { return a.ID == id })
	if i < 0 {
		t.Fatalf("the scheduler has no approval %s: %+v", id, list)
	}
	return list[i]
}

func TestCockpitApprovalsAsAnAdminAllowsAHeldRequestOnceAndDeniesAnother(t *testing.T) {
	s, host, hits := approvalSuite(t)
	c := openCockpit(t, s, "") // root: berth's policy admits it
	c.open("/approvals")
	c.waitFor(live, `document.getElementById("view-approvals").dataset.loaded === "true" && document.getElementById("approvals-pending-empty").hidden === false`)

	// A run's request waits at its proxy; the page shows it without reload
	// (the view polls: no signal says an approval came).
	id := s.mustPost(t, "asker", fetchVia(host, "/charge?n=1"))
	ap := s.pendingApproval(t, host)
	row := jsApprovalRow("approvals-pending", ap.ID)
	c.waitFor(live, row+`?.dataset.state === "pending"`)
	c.noReload()
	cell := func(row, label string) string {
		return evalString(c, row+`.querySelector('[data-label=`+strconv.Quote(label)+`]').textContent`)
	}
	for label, want := range map[string]string{"Agent": "asker", "Request": ap.What, "Rule": "GET " + host, "Conversation": "hooks / asker", "State": "pending", "Decided by": ""} {
		if got := cell(row, label); got != want {
			t.Errorf("the pending approval's %s shows as %q, want %q", label, got, want)
		}
	}
	if !strings.HasPrefix(ap.What, "GET "+host) {
		t.Errorf("the approval asks for %q, want a GET of %s", ap.What, host)
	}
	for _, label := range []string{"Asked", "Deadline"} {
		if got := cell(row, label); got == "" || got == "—" {
			t.Errorf("the pending approval's %s shows as %q", label, got)
		}
	}
	if got := cell(row, "Deadline"); !strings.Contains(got, "in ") {
		t.Errorf("the pending approval's deadline %q does not say how long is left", got)
	}
	c.screenshot("cockpit-approvals.png")

	// The control: until the click nothing decided it. The request still
	// waits, the scheduler has it pending, and the upstream got nothing.
	button := func(row, decision string) string {
		return row + `?.querySelector('button[data-decide=` + strconv.Quote(decision) + `]')`
	}
	c.waitFor(live, button(row, "allow_once")+`?.disabled === false`)
	// A page that was not redrawn yet keeps this Deny: it must be refused.
	c.eval(`window.staleDeny = ` + button(row, "deny"))
	time.Sleep(time.Second)
	if got := approvalState(t, s, ap.ID); got.State != "pending" || got.By != "" {
		t.Fatalf("before the click the approval is %s by %q, want pending", got.State, got.By)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests before anybody decided", n)
	}

	// Allow once: the request reaches the upstream, the run goes on, and
	// the approval is allowed by the Cockpit user, live on the page.
	c.eval(button(row, "allow_once") + `.click()`)
	reply := s.sink.answer(t, time.Minute, id)
	if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "the-upstream-answered") {
		t.Fatalf("reply after Allow once: state %v %q", reply["state"], got)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("the upstream got %d requests after Allow once, want 1", n)
	}
	if got := approvalState(t, s, ap.ID); got.State != "allowed" || got.Standing || got.By != "berthctl:root" {
		t.Errorf("after Allow once the approval is %s (standing %v) by %q, want allowed once by berthctl:root", got.State, got.Standing, got.By)
	}
	if rec := s.runRecord(t, reply).Egress.Text; !strings.Contains(rec, "approved by berthctl:root") {
		t.Errorf("the run record does not name the Cockpit user as the approver: %s", rec)
	}
	decided := jsApprovalRow("approvals-decided", ap.ID)
	c.waitFor(live, `!`+row+` && `+decided+`?.dataset.state === "allowed"`)
	if got := cell(decided, "Decided by"); !strings.HasPrefix(got, "berthctl:root") {
		t.Errorf("the decided approval's decider shows as %q, want berthctl:root", got)
	}
	if got := evalString(c, `document.getElementById("approvals-done").textContent`); !strings.Contains(got, "allowed once") || !strings.Contains(got, ap.ID) {
		t.Errorf("after Allow once the page says %q", got)
	}
	if got := evalString(c, `String(`+decided+`.querySelectorAll("button").length)`); got != "0" {
		t.Errorf("a decided approval offers %s buttons", got)
	}

	// Decided is decided: the stale Deny (as on another admin's page, not
	// redrawn yet: enabled) is refused with berth's error, shown, and the
	// approval stays allowed.
	c.eval(`window.staleDeny.disabled = false; window.staleDeny.click()`)
	c.waitFor(live, `document.getElementById("approvals-error").textContent.includes("is allowed already")`)
	if got := evalString(c, `document.getElementById("approvals-error").textContent`); !strings.Contains(got, "dev.berth.Error.InvalidArgument") || !strings.Contains(got, ap.ID) {
		t.Errorf("the refused decision shows as %q, want berth's error naming the approval", got)
	}
	if got := approvalState(t, s, ap.ID); got.State != "allowed" {
		t.Errorf("after a refused second decision the approval is %s", got.State)
	}

	// Deny: the tool gets berth's 403 naming the decider, nothing reaches
	// the upstream.
	id2 := s.mustPost(t, "asker", fetchVia(host, "/charge?n=2"))
	ap2 := s.pendingApproval(t, host)
	row2 := jsApprovalRow("approvals-pending", ap2.ID)
	c.waitFor(live, button(row2, "deny")+`?.disabled === false`)
	c.eval(button(row2, "deny") + `.click()`)
	reply2 := s.sink.answer(t, time.Minute, id2)
	if got := text(reply2); !strings.Contains(got, "403") || !strings.Contains(got, "denied by berthctl:root") {
		t.Errorf("reply after Deny: %q, want the proxy's 403 naming the decider", got)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("a denied request reached the upstream (%d requests)", n)
	}
	c.waitFor(live, jsApprovalRow("approvals-decided", ap2.ID)+`?.dataset.state === "denied"`)
	c.waitFor(live, `document.getElementById("approvals-error").hidden === true && document.getElementById("approvals-pending-empty").hidden === false`)
	c.noReload()
	c.screenshot("cockpit-approvals-decided.png")
}

// berth's policy lets only root and berth-admin list and decide approvals:
// anyone else sees the refusal, and nothing of the held request.
func TestCockpitApprovalsForAUserThePolicyRefusesShowsTheRefusalAndNothingOfTheRequest(t *testing.T) {
	s, host, hits := approvalSuite(t)
	s.mustPost(t, "asker", fetchVia(host, "/secret-path"))
	ap := s.pendingApproval(t, host)
	t.Cleanup(func() {
		_, _ = s.scheduler(t).DecideApproval(context.Background(), ap.ID, busapi.DecisionDeny)
	})

	c := openCockpit(t, s, "nobody")
	c.open("/approvals")
	c.waitFor(live, `document.getElementById("approvals-error").textContent.includes("org.freedesktop.DBus.Error.AccessDenied")`)
	c.waitFor(live, `document.getElementById("approvals-error").textContent.includes("berth-admin")`)
	if got := evalString(c, `String(document.querySelectorAll("#view-approvals tr[data-approval-id]").length)`); got != "0" {
		t.Errorf("a refused user sees %s approval rows", got)
	}
	if html := evalString(c, `document.documentElement.outerHTML`); strings.Contains(html, "secret-path") || strings.Contains(html, ap.ID) {
		t.Error("the held request reached a user who may not list approvals")
	}
	if got := approvalState(t, s, ap.ID); got.State != "pending" || hits.Load() != 0 {
		t.Errorf("after a refused user's page the approval is %s and the upstream got %d requests", got.State, hits.Load())
	}
	c.noReload()
}
