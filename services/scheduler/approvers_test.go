package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/metrics"
)

// approversConfig is testConfig with slack:U1 approving alpha's asks.
func approversConfig() *config.Config {
	cfg := testConfig(1)
	cfg.Approvers = config.Approvers{"alpha": {"slack:U1"}}
	return cfg
}

// askIn asks a in the conversation c/ch/th for run id of agent alpha.
func askIn(s *Service, id, ch, th string, proxy proxyAnswers, a egresspolicy.Ask) {
	r := Run{ID: id, Agent: "alpha", MessageID: "c/" + id, Connector: "c", Channel: ch, Thread: th}
	s.onAsk(func() Run { return r }, 10*time.Minute, proxy.answer)(a)
}

var stripe = egresspolicy.Ask{ID: "a1", Method: "POST", Host: "api.stripe.com", Port: 443, Path: "/v1/charges", Rule: "POST api.stripe.com"}

// Only an agent's [[approvers]] decide in the chat: anyone else's click
// changes nothing and reaches no proxy; the approver's does, and is named.
func TestOnlyAnApproverDecidesInTheChat(t *testing.T) {
	t.Parallel()
	s := newTestService(t, approversConfig(), "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClock()))
	proxy := make(proxyAnswers, 4)
	askIn(s, "run1", "C1", "T1", proxy, stripe)
	waitApproval(t, s, "run1-a1")

	for _, who := range []string{"slack:U2", "discord:U1", "", "slack:"} {
		ap, err := s.DecideApprovalFor("run1-a1", decision{allow: true}, who)
		if !errors.Is(err, ErrNotApprover) || ap.State != ApprovalPending {
			t.Fatalf("DecideApprovalFor by %q = %+v, %v; want refused, still pending", who, ap, err)
		}
	}
	select {
	case a := <-proxy:
		t.Fatalf("a refused click reached the proxy: %+v", a)
	default:
	}
	ap, err := s.DecideApprovalFor("run1-a1", decision{allow: true}, "slack:U1")
	if err != nil || ap.State != ApprovalAllowed || ap.By != "slack:U1" {
		t.Fatalf("the approver's click: %+v, %v", ap, err)
	}
	if a := proxy.next(t); !a.Allow || a.Standing || a.By != "slack:U1" {
		t.Fatalf("the proxy got %+v", a)
	}
	// Control: the same check refuses the approver for another agent.
	askBeta := Run{ID: "run2", Agent: "beta", Connector: "c"}
	s.onAsk(func() Run { return askBeta }, time.Minute, proxy.answer)(stripe)
	waitApproval(t, s, "run2-a1")
	if _, err := s.DecideApprovalFor("run2-a1", decision{allow: true}, "slack:U1"); !errors.Is(err, ErrNotApprover) {
		t.Fatalf("alpha's approver decided for beta: %v", err)
	}
}

// The question offers the chat's choices only to an agent with approvers;
// without, it says admins decide.
func TestTheQuestionOffersChoicesOnlyWithApprovers(t *testing.T) {
	t.Parallel()
	ap := Approval{ID: "run1-a1", Agent: "alpha", What: "POST api.stripe.com:443/v1/charges", Rule: "POST api.stripe.com"}
	text, q := questionOf(approversConfig(), ap)
	if q == nil || q.ID != ap.ID || q.What != ap.What || strings.Join(q.Choices, ",") != "allow_once,allow_conversation,deny" {
		t.Fatalf("question = %+v", q)
	}
	if !strings.Contains(text, "approve run1-a1") || !strings.Contains(text, "deny run1-a1") {
		t.Fatalf("text names no keywords: %s", text)
	}
	text, q = questionOf(testConfig(1), ap)
	if q != nil || !strings.Contains(text, "berthctl approvals allow run1-a1") {
		t.Fatalf("without approvers: %q, %+v", text, q)
	}
	// Delivered: the ask's reply carries the question.
	d := newDeliveries(0)
	s := newTestService(t, approversConfig(), "", newGateBackend("landlock"), d, withClock(clockwork.NewFakeClock()))
	askIn(s, "run3", "C1", "", make(proxyAnswers, 1), stripe)
	waitApproval(t, s, "run3-a1")
	waitFor(t, func() bool { _, got := d.snapshot(); return len(got) == 1 })
	_, got := d.snapshot()
	if got[0].RunID != "ask-run3-a1" || got[0].Question == nil || got[0].Question.ID != "run3-a1" || got[0].Channel != "C1" {
		t.Fatalf("delivered %+v", got[0])
	}
	if w := busapi.ReplyFromWire(got[0].Wire()); w.Question == nil || strings.Join(w.Question.Choices, ",") != "allow_once,allow_conversation,deny" {
		t.Fatalf("the question does not survive the wire: %+v", w.Question)
	}
}

// "Allow for this conversation" is remembered in scheduler.db: a later
// run's ask of the same rule in the same conversation is allowed without
// asking, after a restart too; another thread, rule or agent asks again.
func TestAnAllowForTheConversationHoldsForItsLaterRunsAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := clockwork.NewFakeClock()
	s := newTestService(t, approversConfig(), dir, newGateBackend("landlock"), nil, withClock(clock))
	proxy := make(proxyAnswers, 8)
	askIn(s, "run1", "C1", "T1", proxy, stripe)
	waitApproval(t, s, "run1-a1")
	ap, err := s.DecideApprovalFor("run1-a1", decision{allow: true, standing: true, conversation: true}, "slack:U1")
	if err != nil || !ap.Conversation || !ap.Standing {
		t.Fatalf("allow for the conversation: %+v, %v", ap, err)
	}
	if a := proxy.next(t); !a.Allow || !a.Standing {
		t.Fatalf("the proxy got %+v, want a standing allow", a)
	}
	s.Close()

	s2 := newTestService(t, approversConfig(), dir, newGateBackend("landlock"), nil, withClock(clock))
	askIn(s2, "run2", "C1", "T1", proxy, stripe)
	if a := proxy.next(t); !a.Allow || !a.Standing || a.By != "slack:U1 (for this conversation)" {
		t.Fatalf("the later run's ask: %+v, want allowed by the earlier decision", a)
	}
	if ap, _, _ := s2.getApproval("run2-a1"); ap.State != ApprovalAllowed || !ap.Conversation {
		t.Fatalf("the later approval is recorded as %+v", ap)
	}
	// Controls: another thread, another rule ask a person again.
	askIn(s2, "run3", "C1", "T2", proxy, stripe)
	waitApproval(t, s2, "run3-a1")
	other := stripe
	other.Rule = "*.stripe.com"
	askIn(s2, "run4", "C1", "T1", proxy, other)
	waitApproval(t, s2, "run4-a1")
	// Past the retention, the conversation asks again.
	clock.Advance(approvalRetention + time.Hour)
	askIn(s2, "run5", "C1", "T1", proxy, stripe)
	waitApproval(t, s2, "run5-a1")
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A Discord role named in [[approvers]] lets its members decide; another
// role, a role of another platform, or a user id shaped as a role do not.
func TestARoleNamedAsApproverLetsItsMembersDecide(t *testing.T) {
	t.Parallel()
	cfg := testConfig(1)
	cfg.Approvers = config.Approvers{"alpha": {"discord:role:700"}}
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClock()))
	proxy := make(proxyAnswers, 4)
	askIn(s, "run1", "C1", "", proxy, stripe)
	waitApproval(t, s, "run1-a1")
	for _, c := range []struct {
		approver string
		groups   []string
	}{
		{"discord:900", []string{"discord:role:701"}},       // another role
		{"discord:900", []string{"slack:role:700"}},         // another platform's
		{"discord:role:700", nil},                           // a user id shaped as the role
		{"", []string{"discord:role:700"}},                  // nobody named
		{"discord:900", []string{"discord:role:700x", "x"}}, // near misses
	} {
		if ap, err := s.DecideApprovalFor("run1-a1", decision{allow: true}, c.approver, c.groups...); !errors.Is(err, ErrNotApprover) || ap.State != ApprovalPending {
			t.Fatalf("%q in %v decided: %+v, %v", c.approver, c.groups, ap, err)
		}
	}
	ap, err := s.DecideApprovalFor("run1-a1", decision{allow: true}, "discord:900", "discord:role:12", "discord:role:700")
	if err != nil || ap.State != ApprovalAllowed || ap.By != "discord:900" {
		t.Fatalf("a member of the role: %+v, %v", ap, err)
	}
	if a := proxy.next(t); !a.Allow || a.By != "discord:900" {
		t.Fatalf("the proxy got %+v", a)
	}
}

// A Slack user group named in [[approvers]] lets its members decide, and
// only as a Slack group.
func TestAUserGroupNamedAsApproverLetsItsMembersDecide(t *testing.T) {
	t.Parallel()
	cfg := testConfig(1)
	cfg.Approvers = config.Approvers{"alpha": {"slack:usergroup:S0OPS"}}
	s := newTestService(t, cfg, "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClock()))
	proxy := make(proxyAnswers, 4)
	askIn(s, "run1", "C1", "", proxy, stripe)
	waitApproval(t, s, "run1-a1")
	for _, c := range []struct {
		approver string
		groups   []string
	}{
		{"discord:900", []string{"slack:usergroup:S0OPS"}}, // a Discord user with a Slack group
		{"slack:usergroup:S0OPS", nil},                     // a user id shaped as the group
		{"slack:U2", []string{"slack:usergroup:S0DEV"}},    // another group
	} {
		if _, err := s.DecideApprovalFor("run1-a1", decision{allow: true}, c.approver, c.groups...); !errors.Is(err, ErrNotApprover) {
			t.Fatalf("%q in %v: %v, want refused", c.approver, c.groups, err)
		}
	}
	if ap, err := s.DecideApprovalFor("run1-a1", decision{}, "slack:U2", "slack:usergroup:S0OPS"); err != nil || ap.State != ApprovalDenied || ap.By != "slack:U2" {
		t.Fatalf("a member of the group: %+v, %v", ap, err)
	}
}

// Approvals are counted by agent and outcome, and the pending ones are a
// gauge: asked, refused clicks (not counted), a decision, a conversation's
// earlier allow, and an approval whose run ended.
func TestApprovalsAreCountedByOutcome(t *testing.T) {
	t.Parallel()
	s := newTestService(t, approversConfig(), "", newGateBackend("landlock"), nil, withClock(clockwork.NewFakeClock()))
	proxy := make(proxyAnswers, 8)
	sample := func(name string, labels ...string) float64 {
		t.Helper()
		fams, err := s.Metrics().Gather()
		if err != nil {
			t.Fatal(err)
		}
		v, _ := metrics.Sample(fams, name, labels...)
		return v
	}
	askIn(s, "run1", "C1", "T1", proxy, stripe)
	waitApproval(t, s, "run1-a1")
	if p := sample("berth_scheduler_approvals_pending"); p != 1 {
		t.Fatalf("pending = %v with one ask waiting, want 1", p)
	}
	_, _ = s.DecideApprovalFor("run1-a1", decision{allow: true}, "slack:U2") // refused: not counted
	if _, err := s.DecideApprovalFor("run1-a1", decision{allow: true, standing: true, conversation: true}, "slack:U1"); err != nil {
		t.Fatal(err)
	}
	proxy.next(t)
	askIn(s, "run2", "C1", "T1", proxy, stripe) // answered by the conversation's allow
	proxy.next(t)
	askIn(s, "run3", "C9", "", proxy, stripe)
	waitApproval(t, s, "run3-a1")
	s.endApprovals("run3")
	for outcome, want := range map[string]float64{"asked": 2, "allowed": 1, "remembered": 1, "ended": 1, "denied": 0} {
		if got := sample("berth_scheduler_approvals_total", "agent", "alpha", "outcome", outcome); got != want {
			t.Errorf("approvals_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	if p := sample("berth_scheduler_approvals_pending"); p != 0 {
		t.Errorf("pending = %v after all were answered, want 0", p)
	}
}
