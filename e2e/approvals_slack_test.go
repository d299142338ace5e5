package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

// On Slack an approval is asked with buttons: another user's click is
// refused with a note in the thread and changes nothing; intake SIGKILLed
// while the run waits loses nothing; the named
// approver's "Allow once" turns the question into the decision and lets
// the tool's request reach the host, and the run record names the approver
// by their Slack user id.
func TestPlatformSlackApprovalButtonsOnlyTheApproverDecides(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	host, hits := askedUpstream(t)

	fake := slacktest.New(t, slacktest.Options{AppToken: "xapp-1-e2e-approve-app", BotToken: "xoxb-e2e-approve-bot"})
	o := fake.Options()
	cfg := fmt.Sprintf(`[providers]
primary = "local"

[[agents]]
id = "ops"
max_iterations = 4
[agents.egress]
ask = [%q]

[intake]
default_agent = "ops"

[[connectors]]
id = "sl"
type = "slack"
base_url = %q
app_token = "$SLACK_APP"
bot_token = "$SLACK_BOT"
trigger = "all"

[[approvers]]
agent = "ops"
users = ["slack:U0APPROVER"]

[scheduler]
max_concurrent_runs = 4
default_timeout_seconds = 60
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, "GET "+host, fake.APIURL(), filepath.Join(binDir, "berth-agent"))
	s := launch(t, nil, cfg, []string{"SLACK_APP=" + o.AppToken, "SLACK_BOT=" + o.BotToken}, o.AppToken, o.BotToken)
	ctx := platformCtx(t)
	if err := fake.WaitConnections(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ev := slacktest.Event{Type: "message", Channel: "C0CHAN", ChannelType: "channel", User: "U0ALICE", TS: "1700000000.000001", Team: o.TeamID,
		Text: fmt.Sprintf(`/tool web_fetch {"url":"http://%s/deploy"}`, host)}
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	ap := s.pendingApproval(t, host)
	posts, err := fake.WaitPosts(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	question := posts[0]
	if question.ThreadTS != ev.TS || len(question.Buttons()) != 3 || !strings.Contains(question.Text, ap.What) {
		t.Fatalf("the question post: %+v", question)
	}

	// Another user's click: a note in the thread, nothing decided.
	if _, err := fake.Click(ctx, "U0MALLORY", question, connector.ChoiceValue(ap.ID, connector.DecideAllowOnce)); err != nil {
		t.Fatal(err)
	}
	posts, err = fake.WaitPosts(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if note := posts[1]; !strings.Contains(note.Text, "slack:U0MALLORY is not one of agent ops's approvers") || note.ThreadTS != ev.TS {
		t.Fatalf("the refused click's note: %+v", note)
	}
	if still := s.pendingApproval(t, host); still.ID != ap.ID || hits.Load() != 0 {
		t.Fatalf("after a refused click: pending %+v, upstream hits %d", still, hits.Load())
	}

	// Intake SIGKILLed while the run waits: the next intake (D-Bus
	// activated) connects again, and the approver's click still decides.
	if err := s.KillService(bus.IntakeName, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := s.conn(t).Object(bus.IntakeName, bus.IntakePath).Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
		t.Fatalf("cannot activate intake again: %v", err)
	}
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}

	// The approver's click.
	if _, err := fake.Click(ctx, "U0APPROVER", question, connector.ChoiceValue(ap.ID, connector.DecideAllowOnce)); err != nil {
		t.Fatal(err)
	}
	// The decision takes the place of the question (its buttons gone); the
	// run's reply follows.
	posts, err = fake.WaitPosts(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if reply := posts[2].Text; !strings.Contains(reply, "the-upstream-answered") {
		t.Fatalf("after the approver's click the thread got %+v", posts)
	}
	// The two are sent in either order: wait for the edit.
	for q := fake.Posts()[0]; !strings.Contains(q.Text, "Allowed once by slack:U0APPROVER") || len(q.Buttons()) != 0; q = fake.Posts()[0] {
		if ctx.Err() != nil {
			t.Fatalf("the question after the decision: %+v, want the decision without buttons", q)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if hits.Load() != 1 {
		t.Errorf("the upstream got %d requests, want the one allowed", hits.Load())
	}
	list, err := s.scheduler(t).ListApprovals(ctx, "allowed")
	if err != nil || len(list) != 1 || list[0].By != "slack:U0APPROVER" {
		t.Fatalf("allowed approvals: %+v, %v", list, err)
	}
	if rec := s.getRun(t, list[0].RunID).Egress.Text; !strings.Contains(rec, "approved by slack:U0APPROVER") {
		t.Errorf("the run record does not name the approver: %s", rec)
	}
}
