package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

// nth waits for the n-th reply (1-based) to message id.
func (s *replySink) nth(t *testing.T, timeout time.Duration, id string, n int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		rs := s.byID[id]
		var got map[string]any
		if len(rs) >= n {
			got = rs[n-1]
		}
		s.mu.Unlock()
		if got != nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s has %d replies after %v, want %d", id, len(rs), timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pendingApproval waits for the one pending approval of run-less search:
// the newest pending one whose request names want.
func (s *suite) pendingApproval(t *testing.T, want string) busapi.Approval {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := s.scheduler(t).ListApprovals(context.Background(), "pending")
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		for _, a := range list {
			if strings.Contains(a.What, want) {
				return a
			}
		}
		if time.Now().After(deadline) {
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
	var hits atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "the-upstream-answered")
	}))
	t.Cleanup(upstream.Close)
	host := strings.TrimPrefix(upstream.URL, "http://")
	s := start(t, []agentSpec{{id: "asker", extra: fmt.Sprintf("[agents.egress]\nask = [%q]\n", "GET "+host)}})
	fetch := fmt.Sprintf(`/tool web_fetch {"url":"http://%s/charge"}`, host)

	t.Run("allowed", func(t *testing.T) {
		id := s.mustPost(t, "asker", fetch)
		ap := s.pendingApproval(t, host)
		if ap.Agent != "asker" || !strings.HasPrefix(ap.What, "GET "+host) || ap.Rule != "GET "+host {
			t.Fatalf("pending approval %+v", ap)
		}
		question := s.sink.nth(t, time.Minute, id, 1)
		if q := text(question); !strings.Contains(q, "berthctl approvals allow "+ap.ID) || !strings.Contains(q, ap.What) {
			t.Errorf("the conversation was asked %q, want the request and how to decide it", q)
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("the upstream got %d requests before anybody decided", n)
		}
		if out, err := s.berthctl(t, "approvals", "allow", ap.ID); err != nil || !strings.Contains(out, "allowed") {
			t.Fatalf("berthctl approvals allow: %v\n%s", err, out)
		}
		reply := s.sink.nth(t, time.Minute, id, 2)
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
		id := s.mustPost(t, "asker", fetch)
		ap := s.pendingApproval(t, host)
		if out, err := s.berthctl(t, "approvals", "deny", ap.ID); err != nil || !strings.Contains(out, "denied") {
			t.Fatalf("berthctl approvals deny: %v\n%s", err, out)
		}
		reply := s.sink.nth(t, time.Minute, id, 2)
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
