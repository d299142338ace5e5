package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// On Discord, with a container agent and a role as approver: the
// question's buttons arrive on the bot's post; a click over the gateway by
// someone without the role is refused
// with a note and nothing reaches the host; the approver's "Deny" turns
// the question into the decision and gets the tool berth's 403 naming
// them, and the run record says so.
func TestPlatformDiscordApprovalButtonsOnlyTheApproverDecides(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	testdocker.Engine(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	host, hits := askedUpstream(t)
	fake := discordtest.New(t)
	const guild, channel = "300000000000000101", "300000000000000102"
	approver := discordtest.User{ID: "400000000000000777", Username: "approver"}
	mallory := discordtest.User{ID: "400000000000000666", Username: "approver-lookalike"}
	const opsRole = "700000000000000042" // [[approvers]] name the role; the approver is in it
	cfg := fmt.Sprintf(`[providers]
primary = "local"

[[agents]]
id = "ops"
max_iterations = 4
[agents.egress]
ask = [%q]
%s

[intake]
default_agent = "ops"

[[connectors]]
id = "dc"
type = "discord"
base_url = %q
token = "$DISCORD_TOKEN"
trigger = "all"

[[approvers]]
agent = "*"
users = ["discord:role:%s"]

[scheduler]
max_concurrent_runs = 4
default_timeout_seconds = 60
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, "GET "+host, containerAgent, fake.URL, opsRole, filepath.Join(binDir, "berth-agent"))
	s := launch(t, nil, cfg, []string{"DISCORD_TOKEN=" + fake.Token}, fake.Token)
	fake.WaitHandshakes(t, 1)
	fake.GuildCreate(guild, discordtest.Channel{ID: channel, Name: "general"})
	fake.MessageCreate(discordtest.MessageSpec{ID: "500000000000000101", Channel: channel, Guild: guild,
		Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: fmt.Sprintf(`/tool web_fetch {"url":"http://%s/purge"}`, host)})
	ap := s.pendingApproval(t, host)
	question := fake.WaitPosts(t, 1)[0]
	if len(question.Buttons()) != 3 || !strings.Contains(question.Content, ap.What) {
		t.Fatalf("the question post: %+v", question)
	}
	deny := connector.ChoiceValue(ap.ID, connector.DecideDeny)
	deadline := time.Now().Add(time.Minute)

	fake.Click(discordtest.ClickSpec{ID: "600000000000000001", Channel: channel, Guild: guild, User: mallory, On: question, CustomID: deny,
		Roles: []string{"700000000000000043"}})
	note := fake.WaitPosts(t, 2)[1]
	if !strings.Contains(note.Content, "discord:"+mallory.ID+" is not one of agent ops's approvers") {
		t.Fatalf("the refused click's note: %q", note.Content)
	}
	if still := s.pendingApproval(t, host); still.ID != ap.ID {
		t.Fatalf("after a refused click the pending approval is %+v", still)
	}

	fake.Click(discordtest.ClickSpec{ID: "600000000000000002", Channel: channel, Guild: guild, User: approver, On: question, CustomID: deny,
		Roles: []string{"700000000000000043", opsRole}})
	// The decision takes the place of the question (no buttons left); the
	// run's reply, the proxy's 403, follows in either order.
	reply := fake.WaitPosts(t, 3)[2]
	if !strings.Contains(reply.Content, "denied by discord:"+approver.ID) {
		t.Fatalf("the run's reply after the approver's deny: %q", reply.Content)
	}
	for q := fake.Posts()[0]; !strings.Contains(q.Content, "Denied by discord:"+approver.ID) || len(q.Buttons()) != 0; q = fake.Posts()[0] {
		if time.Now().After(deadline) {
			t.Fatalf("the question after the decision: %+v, want the decision without buttons", q)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if hits.Load() != 0 {
		t.Errorf("a denied request reached the upstream (%d)", hits.Load())
	}
	if rec := s.getRun(t, ap.RunID).Egress.Text; !strings.Contains(rec, "denied by discord:"+approver.ID) {
		t.Errorf("the run record does not name the approver: %s", rec)
	}
}
