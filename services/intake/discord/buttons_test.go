package discord_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// bob clicks; alice asked. Their usernames are not their ids, so an
// AuthorID taken from a name (or from the message) cannot pass.
var bob = discordtest.User{ID: "500000000000000003", Username: "bob"}

const approvalID = "run-7f3a-a1"

// keywordApprovalID has the shape of the scheduler's approval ids, as a
// typed decision must.
const keywordApprovalID = "20261203T111500_123456789_abcdef0123-0123456789abcdef"

var allChoices = []string{connector.DecideAllowOnce, connector.DecideAllowConversation, connector.DecideDeny}

// askQuestion posts a question in chanID as the scheduler's reply to
// message 1001 and returns the post that carries the buttons.
func askQuestion(t *testing.T, fake *discordtest.Server, c *discord.Connector) discordtest.Post {
	t.Helper()
	r := connector.Reply{RunID: "r-ask", MessageID: "1001", Channel: chanID, Text: "The agent asks: POST api.stripe.com:443/v1/charges. Allow?",
		Question: &connector.Question{ID: approvalID, What: "POST api.stripe.com:443/v1/charges", Choices: allChoices}}
	if err := c.Send(context.Background(), r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	p := posts[len(posts)-1]
	if len(p.Buttons()) != 3 {
		t.Fatalf("the question was posted with buttons %+v, want three", p.Buttons())
	}
	return p
}

func TestAQuestionCarriesOneButtonPerChoiceBelowItsLastChunk(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	q := &connector.Question{ID: approvalID, What: "POST api.stripe.com:443/v1/charges", Choices: allChoices}
	long := strings.Repeat("The agent wants to charge a card. ", 130) // three chunks
	if err := c.Send(context.Background(), connector.Reply{RunID: "r1", MessageID: "1001", Channel: chanID, Text: long, Question: q}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	posts := fake.Posts()
	if len(posts) != 3 {
		t.Fatalf("%d posts, want 3 chunks", len(posts))
	}
	for i, p := range posts[:2] {
		if len(p.Components) != 0 {
			t.Errorf("chunk %d carries components %+v; the buttons belong below the last chunk", i+1, p.Components)
		}
	}
	last := posts[2]
	want := []discordtest.Button{
		{Type: 2, Style: 3, Label: "Allow once", CustomID: connector.ChoiceValue(approvalID, connector.DecideAllowOnce)},
		{Type: 2, Style: 1, Label: "Allow for this conversation", CustomID: connector.ChoiceValue(approvalID, connector.DecideAllowConversation)},
		{Type: 2, Style: 4, Label: "Deny", CustomID: connector.ChoiceValue(approvalID, connector.DecideDeny)},
	}
	if len(last.Components) != 1 || last.Components[0].Type != 1 {
		t.Fatalf("last chunk components = %+v, want one action row", last.Components)
	}
	got := last.Buttons()
	if len(got) != len(want) {
		t.Fatalf("buttons = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("button %d = %+v, want %+v", i, got[i], want[i])
		}
		if d, ok := connector.ParseChoice(got[i].CustomID); !ok || d.ApprovalID != approvalID || d.Decision != allChoices[i] {
			t.Errorf("button %d's custom_id %q does not read back as %s on %s", i, got[i].CustomID, allChoices[i], approvalID)
		}
	}

	// Control: a reply without a question has no buttons.
	if err := c.Send(context.Background(), connector.Reply{RunID: "r2", MessageID: "1002", Channel: chanID, Text: "done"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if p := fake.Posts()[3]; len(p.Components) != 0 {
		t.Errorf("a plain reply carries components %+v", p.Components)
	}
}

func TestAQuestionKeepsWithinDiscordsLimits(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t) // answers 400 for a component Discord would refuse
	c, _ := newConnector(t, fake, nil)
	longID := strings.Repeat("x", 70) // allow_conversation's custom_id would be 104 characters
	q := &connector.Question{ID: longID, Choices: []string{
		connector.DecideAllowOnce, connector.DecideAllowOnce, "allow_standing", connector.DecideAllowConversation, connector.DecideDeny}}
	if err := c.Send(context.Background(), connector.Reply{RunID: "r1", MessageID: "1001", Channel: chanID, Text: "Allow?", Question: q}); err != nil {
		t.Fatalf("Send: %v (Discord refuses the whole message for one bad button)", err)
	}
	var ids []string
	for _, b := range fake.Posts()[0].Buttons() {
		ids = append(ids, b.CustomID)
	}
	want := []string{connector.ChoiceValue(longID, connector.DecideAllowOnce), connector.ChoiceValue(longID, connector.DecideDeny)}
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("buttons %q, want %q: once each, only decisions, custom_id at most 100 characters", ids, want)
	}
}

func TestASlashCommandsQuestionCarriesButtonsOnItsFollowUp(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	body, token := fake.Command(discordtest.CommandSpec{ID: "1701", Channel: chanID, Guild: guild, User: alice, Name: "ask"})
	sink := newSink()
	serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	m := sink.messages()[0]
	r := connector.Reply{RunID: "r", MessageID: m.ID, Channel: m.Channel, Text: "Allow?", Meta: m.Meta,
		Question: &connector.Question{ID: approvalID, Choices: allChoices}}
	if err := c.Send(context.Background(), r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	p := fake.Posts()[0]
	if p.Webhook != fake.AppID+"/"+token || len(p.Buttons()) != 3 {
		t.Errorf("follow-up %+v, want the interaction's follow-up with three buttons", p)
	}
}

// A decision's reply turns the question into the decision, without its
// buttons, instead of a message of its own; a refusal's reply is posted
// and leaves the buttons; a question that is gone gets the decision posted.
func TestADecisionTakesThePlaceOfItsQuestion(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	ctx := context.Background()
	q := &connector.Question{ID: approvalID, What: "POST api.stripe.com:443/v1/charges", Choices: allChoices}
	if err := c.Send(ctx, connector.Reply{RunID: "ask-1", MessageID: "1001", Channel: chanID, Text: "Allow?", Question: q}); err != nil {
		t.Fatal(err)
	}
	question := fake.Posts()[0]
	meta := func(decided bool, id string) map[string]string {
		m := map[string]string{connector.MetaQuestion: id, discord.MetaReplyChannel: chanID, discord.MetaReplyTo: id}
		if decided {
			m[connector.MetaDecided] = "true"
		}
		return m
	}
	refusal := connector.Reply{RunID: "decided-1", MessageID: "interaction:1", Channel: chanID, Text: "Not decided: discord:2 is not an approver", Meta: meta(false, question.ID)}
	if err := c.Send(ctx, refusal); err != nil {
		t.Fatal(err)
	}
	if posts := fake.Posts(); len(posts) != 2 || len(posts[0].Buttons()) != 3 || posts[1].Content != refusal.Text {
		t.Fatalf("after a refusal: %+v", posts)
	}
	decided := connector.Reply{RunID: "decided-2", MessageID: "interaction:2", Channel: chanID, Text: "Denied by discord:1: POST api.stripe.com:443/v1/charges (agent ops).", Meta: meta(true, question.ID)}
	if err := c.Send(ctx, decided); err != nil {
		t.Fatal(err)
	}
	if posts := fake.Posts(); len(posts) != 2 || posts[0].Content != decided.Text || len(posts[0].Buttons()) != 0 {
		t.Fatalf("after the decision: %+v, want the question turned into it without buttons", posts)
	}
	gone := decided
	gone.RunID, gone.Meta = "decided-3", meta(true, "999999999999999999")
	if err := c.Send(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if posts := fake.Posts(); len(posts) != 3 || posts[2].Content != decided.Text {
		t.Fatalf("with the question gone: %+v, want the decision posted", posts)
	}
}
