package slack

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

const testApprovalID = "20261203T111500_123456789_abcdef0123-0123456789abcdef"

var testQuestion = &connector.Question{ID: testApprovalID, What: "POST api.stripe.com:443/v1/charges",
	Choices: []string{connector.DecideAllowOnce, connector.DecideAllowConversation, connector.DecideDeny}}

// A question is posted with a button per choice, within Block Kit's limits
// (the fake refuses a post beyond them); a reply without one has none.
func TestAQuestionIsPostedWithItsButtons(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := startSocket(t, fake, newSink(), nil)
	if err := c.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "C0CHAN:1.1", Channel: "C0CHAN", Thread: "1.1",
		Text: "berth asks: may agent asker do POST api.stripe.com:443/v1/charges?", Question: testQuestion}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(ctx, connector.Reply{RunID: "r-2", MessageID: "C0CHAN:1.2", Channel: "C0CHAN", Thread: "1.2", Text: "plain"}); err != nil {
		t.Fatal(err)
	}
	posts := fake.Posts()
	var got []string
	for _, b := range posts[0].Buttons() {
		got = append(got, b.Text.Text+"="+b.Value)
	}
	want := []string{
		"Allow once=" + connector.ChoiceValue(testApprovalID, connector.DecideAllowOnce),
		"Allow for this conversation=" + connector.ChoiceValue(testApprovalID, connector.DecideAllowConversation),
		"Deny=" + connector.ChoiceValue(testApprovalID, connector.DecideDeny),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("buttons:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if posts[0].ThreadTS != "1.1" || !strings.Contains(posts[0].Blocks[0].Text.Text, "may agent asker") {
		t.Errorf("the question post: %+v", posts[0])
	}
	if len(posts[1].Blocks) != 0 {
		t.Errorf("a plain reply has blocks: %+v", posts[1].Blocks)
	}
}

// A click on a berth button over Socket Mode becomes one decision by the
// clicker's user id, acknowledged only once intake has it; a click on
// anything else decides nothing.
func TestAClickIsADecisionOfTheClickerAckedAfterAccept(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	var ackedDuringAccept atomic.Bool
	sink.accept = func(connector.Message) error {
		if len(fake.Acks()) > 0 {
			ackedDuringAccept.Store(true)
		}
		return nil
	}
	c, _ := startSocket(t, fake, sink, nil)
	if err := c.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "C0CHAN:1.1", Channel: "C0CHAN", Thread: "1.1", Text: "may it?", Question: testQuestion}); err != nil {
		t.Fatal(err)
	}
	post := fake.Posts()[0]
	allow := connector.ChoiceValue(testApprovalID, connector.DecideAllowConversation)
	id, err := fake.Click(ctx, "U0BOB", post, allow)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.WaitAck(ctx, id); err != nil {
		t.Fatal(err)
	}
	got := sink.wait(ctx, t, 1)[0]
	if ackedDuringAccept.Load() {
		t.Error("the click was acknowledged before Accept returned")
	}
	if got.Decision == nil || *got.Decision != (connector.Decision{ApprovalID: testApprovalID, Decision: connector.DecideAllowConversation}) ||
		got.AuthorID != "U0BOB" || got.Channel != "C0CHAN" || got.Thread != "1.1" || got.Connector != "slack-test" {
		t.Fatalf("the click became %+v (decision %+v)", got, got.Decision)
	}
	// Not berth's buttons: acknowledged, nothing accepted.
	for _, v := range []string{"deploy-now", "berth-approval:allow_always:" + testApprovalID} {
		id, err := fake.DeliverInteraction(ctx, fake.ClickPayload("U0BOB", post, v))
		if err != nil {
			t.Fatal(err)
		}
		if err := fake.WaitAck(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// The control: a real click after them is the second call, so the
	// two before it were not taken.
	if _, err := fake.Click(ctx, "U0CAROL", post, connector.ChoiceValue(testApprovalID, connector.DecideDeny)); err != nil {
		t.Fatal(err)
	}
	calls := sink.wait(ctx, t, 2)
	if len(calls) != 2 || calls[1].AuthorID != "U0CAROL" || calls[1].Decision.Decision != connector.DecideDeny {
		t.Fatalf("calls after foreign clicks: %+v", calls)
	}
}

// In events mode, the click is a signed form POST to the same URL: a
// good signature is a decision, a forged one is refused and decides
// nothing.
func TestAnInteractivityRequestIsSignedLikeEvents(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	_, url, clock, _ := eventsEndpoint(t, fake, sink)
	post := slacktest.Post{Channel: "C0CHAN", TS: "1.1", ThreadTS: "1.0"}
	payload := fake.ClickPayload("U0BOB", post, connector.ChoiceValue(testApprovalID, connector.DecideAllowOnce))
	if code, err := fake.PostInteraction(ctx, url, "not-the-secret", clock.Now(), payload); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("a forged interaction: %d, %v; want 401", code, err)
	}
	if n := len(sink.Calls()); n != 0 {
		t.Fatalf("a forged interaction reached the sink (%d calls)", n)
	}
	if code, err := fake.PostInteraction(ctx, url, testSigningSecret, clock.Now(), payload); err != nil || code != http.StatusOK {
		t.Fatalf("a signed interaction: %d, %v; want 200", code, err)
	}
	got := sink.wait(ctx, t, 1)[0]
	if got.Decision == nil || got.Decision.Decision != connector.DecideAllowOnce || got.AuthorID != "U0BOB" || got.Thread != "1.0" {
		t.Fatalf("the click became %+v", got)
	}
}

// A decision's reply turns the question into the decision, without its
// buttons, instead of a post of its own; a refusal's reply is posted and
// leaves the question's buttons.
func TestADecisionTakesThePlaceOfItsQuestion(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := startSocket(t, fake, newSink(), nil)
	if err := c.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "C0CHAN:1.1", Channel: "C0CHAN", Thread: "1.1", Text: "may it?", Question: testQuestion}); err != nil {
		t.Fatal(err)
	}
	q := fake.Posts()[0]
	refusal := connector.Reply{RunID: "decided-1", MessageID: "action:1", Channel: "C0CHAN", Thread: "1.1", Text: "Not decided: slack:U2 is not one of agent ops's approvers",
		Meta: map[string]string{connector.MetaQuestion: q.TS}}
	if err := c.Send(ctx, refusal); err != nil {
		t.Fatal(err)
	}
	posts := fake.Posts()
	if len(posts) != 2 || len(posts[0].Buttons()) != 3 || posts[1].Text != refusal.Text {
		t.Fatalf("after a refusal: %+v, want the note posted and the question's buttons kept", posts)
	}
	decided := connector.Reply{RunID: "decided-2", MessageID: "action:2", Channel: "C0CHAN", Thread: "1.1", Text: "Allowed once by slack:U1: POST api.stripe.com:443/v1/charges (agent ops).",
		Meta: map[string]string{connector.MetaQuestion: q.TS, connector.MetaDecided: "true"}}
	if err := c.Send(ctx, decided); err != nil {
		t.Fatal(err)
	}
	posts = fake.Posts()
	if len(posts) != 2 || posts[0].TS != q.TS || posts[0].Text != decided.Text || len(posts[0].Buttons()) != 0 {
		t.Fatalf("after the decision: %+v, want the question turned into the decision without buttons", posts)
	}
	// The control: a question that is gone gets the decision posted.
	gone := decided
	gone.RunID, gone.Meta = "decided-3", map[string]string{connector.MetaQuestion: "9.999", connector.MetaDecided: "true"}
	if err := c.Send(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if posts = fake.Posts(); len(posts) != 3 || posts[2].Text != decided.Text {
		t.Fatalf("with the question gone: %+v, want the decision posted", posts)
	}
}

// A click carries the user groups Slack lists the clicker in (one read of
// the workspace's groups a minute); without the scope it carries none and
// is still the clicker's decision.
func TestAClickCarriesTheClickersUserGroups(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	fake.SetUserGroups(slacktest.UserGroup{ID: "S0OPS", Handle: "ops", Users: []string{"U0BOB", "U0CAROL"}},
		slacktest.UserGroup{ID: "S0DEV", Handle: "dev", Users: []string{"U0CAROL"}})
	sink := newSink()
	c, _ := startSocket(t, fake, sink, nil)
	if err := c.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "C0CHAN:1.1", Channel: "C0CHAN", Thread: "1.1", Text: "may it?", Question: testQuestion}); err != nil {
		t.Fatal(err)
	}
	post := fake.Posts()[0]
	allow := connector.ChoiceValue(testApprovalID, connector.DecideAllowOnce)
	for _, u := range []string{"U0BOB", "U0CAROL", "U0EVE"} {
		if _, err := fake.Click(ctx, u, post, allow); err != nil {
			t.Fatal(err)
		}
	}
	calls := sink.wait(ctx, t, 3)
	got := map[string]string{}
	for _, m := range calls {
		got[m.AuthorID] = strings.Join(m.AuthorGroups, ",")
	}
	if got["U0BOB"] != "usergroup:S0OPS" || got["U0CAROL"] != "usergroup:S0OPS,usergroup:S0DEV" || got["U0EVE"] != "" {
		t.Fatalf("groups by clicker: %v", got)
	}
	if n := fake.UserGroupReads(); n != 1 {
		t.Errorf("usergroups.list was read %d times for three clicks within a minute, want 1", n)
	}
	// Without the scope: no groups, the click still the clicker's.
	fake2 := slacktest.New(t, slacktest.Options{})
	fake2.RefuseUserGroups("missing_scope")
	sink2 := newSink()
	c2, _ := startSocket(t, fake2, sink2, nil)
	if err := c2.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "C0CHAN:1.1", Channel: "C0CHAN", Thread: "1.1", Text: "may it?", Question: testQuestion}); err != nil {
		t.Fatal(err)
	}
	if _, err := fake2.Click(ctx, "U0BOB", fake2.Posts()[0], allow); err != nil {
		t.Fatal(err)
	}
	if m := sink2.wait(ctx, t, 1)[0]; m.AuthorID != "U0BOB" || len(m.AuthorGroups) != 0 || m.Decision == nil {
		t.Fatalf("without the scope: %+v", m)
	}
}
