package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// question and answer wait for the reply to message id that asks for an
// approval (its run id is "ask-…"), and for the run's own reply.
func (s *replySink) question(t *testing.T, timeout time.Duration, id string) map[string]any {
	t.Helper()
	return s.first(t, timeout, id, func(runID string) bool { return strings.HasPrefix(runID, "ask-") })
}

func (s *replySink) answer(t *testing.T, timeout time.Duration, id string) map[string]any {
	t.Helper()
	return s.first(t, timeout, id, func(runID string) bool { return !strings.HasPrefix(runID, "ask-") })
}

func (s *replySink) first(t *testing.T, timeout time.Duration, id string, match func(runID string) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		var got map[string]any
		for _, r := range s.byID[id] {
			if runID, _ := r["run_id"].(string); match(runID) {
				got = r
				break
			}
		}
		s.mu.Unlock()
		if got != nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s has no such reply after %v", id, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pendingApproval waits for the one pending approval of run-less search:
// the newest pending one whose request names want.
func (s *suite) pendingApproval(t *testing.T, want string) busapi.Approval {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	sched := s.scheduler(t)
	for {
		list, err := sched.ListApprovals(context.Background(), "pending")
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		for _, a := range list {
			if strings.Contains(a.What, want) {
				return a
			}
		}
		if time.Now().After(deadline) {
			runs := s.listRuns(t, busapi.ListFilter{})
			for _, r := range runs {
				t.Logf("run %s: %s %s %s", r.ID, r.State, r.Reason, s.getRun(t, r.ID).Error.Text)
			}
			t.Fatalf("no pending approval for %s within a minute: %+v", want, list)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A tool's request an ask rule matches waits at the proxy; the run's
// conversation is asked; an admin's allow lets it reach the host, a deny
// gets berth's 403 naming the decider, and both decisions are in the run
// record with who made them.
func TestApprovalsAnAskedRequestWaitsForTheAdminsDecision(t *testing.T) {
	t.Parallel()
	for _, backend := range []struct{ name, extra string }{{"landlock", ""}, {"container", containerAgent}} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			if backend.name == "container" {
				testdocker.Engine(t)
			}
			approvalsOn(t, backend.extra)
		})
	}
}

func approvalsOn(t *testing.T, extra string) {
	host, hits := askedUpstream(t)
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := askerConfig(sink, fmt.Sprintf("[agents.egress]\nask = [%q]\n%s", "GET "+host, extra))
	s := launch(t, sink, cfg, nil, secret)
	// Each message its own URL: the same signed body in the same second is
	// the same message.
	fetch := func(n int) string { return fmt.Sprintf(`/tool web_fetch {"url":"http://%s/charge?n=%d"}`, host, n) }

	t.Run("allowed", func(t *testing.T) {
		id := s.mustPost(t, "asker", fetch(1))
		ap := s.pendingApproval(t, host)
		if ap.Agent != "asker" || !strings.HasPrefix(ap.What, "GET "+host) || ap.Rule != "GET "+host {
			t.Fatalf("pending approval %+v", ap)
		}
		question := s.sink.question(t, time.Minute, id)
		if q := text(question); !strings.Contains(q, "berthctl approvals allow "+ap.ID) || !strings.Contains(q, ap.What) {
			t.Errorf("the conversation was asked %q, want the request and how to decide it", q)
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("the upstream got %d requests before anybody decided", n)
		}
		if out, err := s.berthctl(t, "approvals", "allow", ap.ID); err != nil || !strings.Contains(out, "allowed") {
			t.Fatalf("berthctl approvals allow: %v\n%s", err, out)
		}
		reply := s.sink.answer(t, time.Minute, id)
		if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "the-upstream-answered") {
			t.Fatalf("reply after the allow: state %v %q", reply["state"], got)
		}
		rec := s.runRecord(t, reply).Egress.Text
		if !strings.Contains(rec, "approved by berthctl:root") {
			t.Errorf("the run record does not name the approver: %s", rec)
		}
		if out, err := s.berthctl(t, "approvals", "--state", "allowed"); err != nil || !strings.Contains(out, ap.ID) || !strings.Contains(out, "berthctl:root") {
			t.Errorf("berthctl approvals --state allowed: %v\n%s", err, out)
		}
	})
	t.Run("denied", func(t *testing.T) {
		before := hits.Load()
		id := s.mustPost(t, "asker", fetch(2))
		ap := s.pendingApproval(t, host)
		if out, err := s.berthctl(t, "approvals", "deny", ap.ID); err != nil || !strings.Contains(out, "denied") {
			t.Fatalf("berthctl approvals deny: %v\n%s", err, out)
		}
		reply := s.sink.answer(t, time.Minute, id)
		if got := text(reply); !strings.Contains(got, "403") || !strings.Contains(got, "denied by berthctl:root") {
			t.Errorf("reply after the deny: %q, want the proxy's 403 naming the decider", got)
		}
		if hits.Load() != before {
			t.Error("a denied request reached the upstream")
		}
		// Decided is decided: a second decision is refused.
		if out, err := s.berthctl(t, "approvals", "allow", ap.ID); err == nil {
			t.Errorf("a second decision was taken:\n%s", out)
		}
	})
}

// A scheduler SIGKILLed while a request waits for approval loses nothing:
// the restarted one closes the dead one's approval as ended, re-runs the
// message once, and its attempt asks again; allowed, the reply comes.
func TestApprovalsASchedulerKilledWhileWaitingAsksAgainAndLosesNothing(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	host, _ := askedUpstream(t)
	sink := newReplySink(t)
	cfg := askerConfig(sink, fmt.Sprintf("[agents.egress]\nask = [%q]\n", "GET "+host))
	s := launch(t, sink, cfg, nil, secret)
	id := s.mustPost(t, "asker", fmt.Sprintf(`/tool web_fetch {"url":"http://%s/after-a-crash"}`, host))
	first := s.pendingApproval(t, host)

	if err := s.KillService(bus.SchedulerName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The next bus call D-Bus-activates a new scheduler.
	if err := s.conn(t).Object(bus.SchedulerName, bus.SchedulerPath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate the scheduler again: %v", err)
	}
	var again busapi.Approval
	for again = s.pendingApproval(t, host); again.ID == first.ID; again = s.pendingApproval(t, host) {
		time.Sleep(50 * time.Millisecond)
	}
	if again.RunID != first.RunID {
		t.Fatalf("the retried attempt asks for run %s, want %s", again.RunID, first.RunID)
	}
	ended, err := s.scheduler(t).ListApprovals(context.Background(), "ended")
	if err != nil || len(ended) != 1 || ended[0].ID != first.ID {
		t.Fatalf("ended approvals %+v, %v: want the dead scheduler's one", ended, err)
	}
	if out, err := s.berthctl(t, "approvals", "allow", again.ID); err != nil {
		t.Fatalf("berthctl approvals allow: %v\n%s", err, out)
	}
	reply := s.sink.answer(t, time.Minute, id)
	if got := text(reply); !strings.Contains(got, "the-upstream-answered") {
		t.Fatalf("reply after the restart: %q", got)
	}
	if r := s.getRun(t, first.RunID); r.Attempts != 2 || r.State != busapi.StateSucceeded {
		t.Fatalf("run %s is %s after %d attempts; want succeeded in the second", r.ID, r.State, r.Attempts)
	}
}

// askedUpstream is the host:port an ask rule names in these tests: it
// answers "the-upstream-answered" and counts the requests that reached it.
func askedUpstream(t *testing.T) (host string, hits *atomic.Int32) {
	t.Helper()
	hits = new(atomic.Int32)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "the-upstream-answered")
	}))
	t.Cleanup(upstream.Close)
	return strings.TrimPrefix(upstream.URL, "http://"), hits
}

// askerConfig is the suite's config with one agent, "asker", its settings
// extra, and the runs' egress proxies as user daemon.
func askerConfig(sink *replySink, extra string) string {
	return strings.Replace(suiteConfig([]agentSpec{{id: "asker", extra: extra}}, sink.srv.URL+"/replies"),
		"[scheduler]\n", "[scheduler]\negress_user = \"daemon\"\n", 1)
}
