package scheduler

import (
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// proxyAnswers stands in for a run's egress proxy on its stdin: it gets
// each answer the scheduler hands it.
type proxyAnswers chan egresspolicy.Answer

func (p proxyAnswers) answer(a egresspolicy.Answer) error { p <- a; return nil }

func (p proxyAnswers) next(t *testing.T) egresspolicy.Answer {
	t.Helper()
	select {
	case a := <-p:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy got no answer")
		return egresspolicy.Answer{}
	}
}

// waitApproval waits until the ask is stored as pending.
func waitApproval(t *testing.T, s *Service, id string) Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ap, ok, err := s.getApproval(id); err == nil && ok {
			s.approvals.mu.Lock()
			_, live := s.approvals.live[id]
			s.approvals.mu.Unlock()
			if live {
				return ap
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("approval %s was not asked", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAnApprovalIsKeptDecidedOnceAndAnsweredToTheProxy(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := newTestService(t, testConfig(1), "", newGateBackend("landlock"), nil, withClock(clock))
	r := Run{ID: "run1", Agent: "alpha", MessageID: "hooks/m1", Connector: "hooks"}
	proxy := make(proxyAnswers, 4)
	ask := s.onAsk(func() Run { return r }, 10*time.Minute, proxy.answer)

	ask(egresspolicy.Ask{ID: "a1", Method: "POST", Host: "api.stripe.com", Port: 443, Path: "/v1/charges", Rule: "POST api.stripe.com"})
	ap := waitApproval(t, s, "run1-a1")
	if ap.State != ApprovalPending || ap.What != "POST api.stripe.com:443/v1/charges" || !ap.Deadline.Equal(clock.Now().Add(10*time.Minute)) {
		t.Fatalf("stored %+v", ap)
	}
	got, err := s.DecideApproval("run1-a1", true, true, "berthctl:root")
	if err != nil || got.State != ApprovalAllowed || !got.Standing || got.By != "berthctl:root" {
		t.Fatalf("DecideApproval = %+v, %v", got, err)
	}
	if a := proxy.next(t); a.ID != "a1" || !a.Allow || !a.Standing || a.By != "berthctl:root" {
		t.Fatalf("the proxy got %+v", a)
	}
	// A second decision is refused and reaches no proxy.
	if _, err := s.DecideApproval("run1-a1", false, false, "berthctl:eve"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a second decision: %v, want it refused", err)
	}
	if list, _ := s.ListApprovals(ApprovalAllowed); len(list) != 1 || list[0].ID != "run1-a1" {
		t.Fatalf("ListApprovals(allowed) = %+v", list)
	}
}

func TestAnApprovalNobodyDecidesIsDeniedAtItsDeadline(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s := newTestService(t, testConfig(1), "", newGateBackend("landlock"), nil, withClock(clock))
	proxy := make(proxyAnswers, 4)
	s.onAsk(func() Run { return Run{ID: "run2", Agent: "alpha"} }, time.Minute, proxy.answer)(egresspolicy.Ask{ID: "a1", Method: "GET", Host: "x.example", Port: 443, Rule: "*.example"})
	waitApproval(t, s, "run2-a1")
	clock.Advance(time.Minute)
	if a := proxy.next(t); a.Allow || a.By != "timeout" {
		t.Fatalf("at the deadline the proxy got %+v, want a denial by timeout", a)
	}
	ap, _, _ := s.getApproval("run2-a1")
	if ap.State != ApprovalExpired || ap.By != "timeout" {
		t.Fatalf("after the deadline: %+v", ap)
	}
	if _, err := s.DecideApproval("run2-a1", true, false, "berthctl:root"); err == nil {
		t.Fatal("an expired approval was decided")
	}
}

// A run that ends, or a scheduler that restarts, leaves no approval
// pending: a late decision is refused with why.
func TestApprovalsOfEndedRunsAndEarlierSchedulersAreClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := clockwork.NewFakeClock()
	s := newTestService(t, testConfig(1), dir, newGateBackend("landlock"), nil, withClock(clock))
	proxy := make(proxyAnswers, 4)
	s.onAsk(func() Run { return Run{ID: "run3", Agent: "alpha"} }, time.Minute, proxy.answer)(egresspolicy.Ask{ID: "a1", Method: "GET", Host: "x.example", Port: 443})
	s.onAsk(func() Run { return Run{ID: "run4", Agent: "alpha"} }, time.Minute, proxy.answer)(egresspolicy.Ask{ID: "a1", Method: "GET", Host: "y.example", Port: 443})
	waitApproval(t, s, "run3-a1")
	waitApproval(t, s, "run4-a1")
	s.endApprovals("run3")
	if ap, _, _ := s.getApproval("run3-a1"); ap.State != ApprovalEnded {
		t.Fatalf("the ended run's approval: %+v", ap)
	}
	if _, err := s.DecideApproval("run3-a1", true, false, "berthctl:root"); err == nil {
		t.Fatal("an ended run's approval was decided")
	}
	// run4's is pending in the store when the next scheduler starts.
	if err := s.closeOrphanedApprovals(); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.ListApprovals(ApprovalPending); len(list) != 0 {
		t.Fatalf("pending after a restart's sweep: %+v", list)
	}
}
