package discord_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

// clickSpec is bob's click on the question's allow-once button in chanID;
// the question answers alice's command and names her, so neither the
// message nor its author may stand in for the clicker.
func clickSpec(on discordtest.Post, id string) discordtest.ClickSpec {
	on.Content = "<@" + alice.ID + "> asked: allow?"
	return discordtest.ClickSpec{ID: id, Channel: chanID, Guild: guild, User: bob, On: on,
		CustomID: connector.ChoiceValue(approvalID, connector.DecideAllowOnce), MessageUser: &alice}
}

// checkDecision checks m is bob's allow-once decision on the question from
// interaction id.
func checkDecision(t *testing.T, m connector.Message, id string, question discordtest.Post) {
	t.Helper()
	if m.ID != "interaction:"+id || m.Connector != "discord-main" {
		t.Errorf("ID = %q on %q, want interaction:%s (intake deduplicates on it)", m.ID, m.Connector, id)
	}
	if m.AuthorID != bob.ID || m.Author != "bob" {
		t.Errorf("author = %q id %q, want the clicker bob %s (never a name, never the asker)", m.Author, m.AuthorID, bob.ID)
	}
	if m.Decision == nil || *m.Decision != (connector.Decision{ApprovalID: approvalID, Decision: connector.DecideAllowOnce}) {
		t.Errorf("Decision = %+v, want allow_once on %s", m.Decision, approvalID)
	}
	if m.Channel != chanID || m.Server != guild || m.Text != "" {
		t.Errorf("channel %q server %q text %q, want the question's channel and guild and no text", m.Channel, m.Server, m.Text)
	}
	if m.Meta[discord.MetaReplyTo] != question.ID || m.Meta[discord.MetaReplyChannel] != chanID {
		t.Errorf("Meta = %v, want the reply to land under the question in its channel", m.Meta)
	}
}

func decoded(t *testing.T, answer string) (typ, flags int, content string) {
	t.Helper()
	var resp struct {
		Type int `json:"type"`
		Data struct {
			Flags   int    `json:"flags"`
			Content string `json:"content"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(answer), &resp); err != nil {
		t.Fatalf("the answer %q is not JSON: %v", answer, err)
	}
	return resp.Type, resp.Data.Flags, resp.Data.Content
}

func TestAClickOverTheInteractionsEndpointBecomesOneDecisionFromTheClicker(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	question := askQuestion(t, fake, c)
	rec := httptest.NewRecorder()
	sink := &hookSink{recordingSink: newSink(), hook: func(connector.Message) {
		if rec.Body.Len() != 0 || rec.Flushed {
			t.Error("the interaction was answered before Accept returned")
		}
	}}
	body, _ := fake.ClickInteraction(clickSpec(question, "3101"))
	c.Handler(sink).ServeHTTP(rec, fake.SignedRequest("/hooks/discord-main", body))
	if answer := strings.TrimSpace(rec.Body.String()); rec.Code != 200 || answer != `{"type":6}` {
		t.Fatalf("click answered %d %s, want 200 {\"type\":6} (DEFERRED_UPDATE_MESSAGE)", rec.Code, answer)
	}
	got := sink.messages()
	if len(got) != 1 || len(sink.acceptCalls()) != 1 {
		t.Fatalf("sink got %d messages in %d calls, want one decision", len(got), len(sink.acceptCalls()))
	}
	checkDecision(t, got[0], "3101", question)

	// The scheduler's answer is an ordinary reply: it lands under the question.
	r := connector.Reply{RunID: "r-decided", MessageID: got[0].ID, Channel: got[0].Channel, Thread: got[0].Thread, Text: "Allowed once by bob.", Meta: got[0].Meta}
	if err := c.Send(context.Background(), r); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if p := fake.Posts()[1]; p.Channel != chanID || p.ReplyTo != question.ID || p.Authority != "Bot "+fake.Token {
		t.Errorf("the decision's reply = %+v, want a bot post in %s replying to the question %s", p, chanID, question.ID)
	}
}

func TestAClickInADMIsTheUsersDecision(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	question := askQuestion(t, fake, c)
	spec := clickSpec(question, "3151")
	spec.Guild, spec.Channel = "", dmID
	body, _ := fake.ClickInteraction(spec)
	sink := newSink()
	if status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 || answer != `{"type":6}` {
		t.Fatalf("click answered %d %s", status, answer)
	}
	m := sink.messages()
	if len(m) != 1 || m[0].AuthorID != bob.ID || m[0].Meta[discord.MetaDM] != "true" || m[0].Channel != dmID || m[0].Server != "" {
		t.Errorf("DM click = %+v, want bob's decision in the DM", m)
	}
}

func TestAClickOverTheGatewayBecomesOneDecisionAndIsAnsweredAfterAccept(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	const thread = "800000000000000007"
	sink := &hookSink{recordingSink: newSink(), hook: func(connector.Message) {
		if n := len(fake.Callbacks()); n != 0 {
			t.Errorf("%d interaction callbacks before Accept returned", n)
		}
	}}
	run(t, c, sink)
	connected(t, fake, c)
	fake.GuildCreate(guild, discordtest.Channel{ID: chanID, Name: "payments"})
	question := askQuestion(t, fake, c)
	spec := clickSpec(question, "3201")
	spec.Channel, spec.ThreadParent = thread, chanID
	token := fake.Click(spec)
	cbs := fake.WaitCallbacks(t, 1)
	if cbs[0].Interaction != "3201" || cbs[0].Token != token || cbs[0].Type != 6 {
		t.Errorf("callback = %+v, want type 6 (DEFERRED_UPDATE_MESSAGE) for interaction 3201", cbs[0])
	}
	if cbs[0].Authority != "" {
		t.Error("the callback carried the bot token; it needs none")
	}
	got := sink.wait(t, 1)
	if len(got) != 1 || len(sink.acceptCalls()) != 1 {
		t.Fatalf("sink got %d messages in %d calls, want one decision", len(got), len(sink.acceptCalls()))
	}
	m := got[0]
	if m.Thread != thread || m.Channel != chanID || m.ChannelName != "payments" {
		t.Errorf("thread %q channel %q name %q, want the thread in its parent channel", m.Thread, m.Channel, m.ChannelName)
	}
	if m.Meta[discord.MetaReplyChannel] != thread {
		t.Errorf("reply channel %q, want the thread %s", m.Meta[discord.MetaReplyChannel], thread)
	}
	m.Meta = maps.Clone(m.Meta)
	m.Meta[discord.MetaReplyChannel] = chanID // checked above; the rest as in a channel
	checkDecision(t, m, "3201", question)
}

func TestAClickIntakeCannotTakeIsAnsweredSoAndDecidesNothing(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	question := askQuestion(t, fake, c)
	sink := newSink()
	run(t, c, sink)
	connected(t, fake, c)

	check := func(how string, typ, flags int, content string, wantTaken bool) {
		t.Helper()
		if wantTaken {
			if typ != 6 {
				t.Errorf("%s: answered type %d, want 6 once Accept took the click", how, typ)
			}
			return
		}
		if typ != 4 || flags != 64 || !strings.Contains(content, "could not take") || !strings.Contains(content, "Try again") {
			t.Errorf("%s: answered type %d flags %d %q, want an ephemeral \"could not take your click, try again\"", how, typ, flags, content)
		}
	}
	sink.failing(1)
	body, _ := fake.ClickInteraction(clickSpec(question, "3301"))
	_, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	typ, flags, content := decoded(t, answer)
	check("HTTP", typ, flags, content, false)

	sink.failing(1)
	fake.Click(clickSpec(question, "3302"))
	cb := fake.WaitCallbacks(t, 1)[0]
	check("gateway", cb.Type, cb.Flags, cb.Content, false)
	if n := len(sink.messages()); n != 0 {
		t.Fatalf("%d messages stored by failing Accepts", n)
	}

	// Control: clicked again, the same clicks are taken.
	body, _ = fake.ClickInteraction(clickSpec(question, "3303"))
	_, answer = serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
	typ, flags, content = decoded(t, answer)
	check("HTTP again", typ, flags, content, true)
	fake.Click(clickSpec(question, "3304"))
	cb = fake.WaitCallbacks(t, 2)[1]
	check("gateway again", cb.Type, cb.Flags, cb.Content, true)
	if m := sink.wait(t, 2); m[0].AuthorID != bob.ID || m[1].AuthorID != bob.ID {
		t.Errorf("stored %+v, want bob's two decisions", m)
	}
}

func TestOnlyAPersonsClickOnABerthButtonDecides(t *testing.T) {
	t.Parallel()
	forged := connector.ChoiceValue("run-other-a9", connector.DecideAllowOnce)
	tests := []struct {
		name    string
		opts    func(*discord.Options)
		mutate  func(s *discordtest.ClickSpec)
		decides bool
	}{
		{"The_genuine_click_decides", nil, func(*discordtest.ClickSpec) {}, true},
		{"A_berth_custom_id_not_on_the_clicked_message_does_not", nil, func(s *discordtest.ClickSpec) { s.CustomID = forged }, false},
		{"Another_apps_button_does_not", nil, func(s *discordtest.ClickSpec) {
			s.On = madeUp(s.On.ID, "poll:vote:yes")
			s.CustomID = "poll:vote:yes"
		}, false},
		{"A_malformed_berth_custom_id_does_not", nil, func(s *discordtest.ClickSpec) {
			s.On = madeUp(s.On.ID, "berth-approval:allow_once:run 1; drop")
			s.CustomID = "berth-approval:allow_once:run 1; drop"
		}, false},
		{"An_unknown_decision_does_not", nil, func(s *discordtest.ClickSpec) {
			s.On = madeUp(s.On.ID, "berth-approval:allow_forever:"+approvalID)
			s.CustomID = "berth-approval:allow_forever:" + approvalID
		}, false},
		{"A_select_menu_with_a_berth_value_does_not", nil, func(s *discordtest.ClickSpec) { s.ComponentType = 3 }, false},
		{"A_bots_click_does_not", nil, func(s *discordtest.ClickSpec) { s.User = robot }, false},
		{"A_bots_click_does_not_even_with_allow_bots", func(o *discord.Options) { o.AllowBots = true }, func(s *discordtest.ClickSpec) { s.User = robot }, false},
		{"A_click_in_a_guild_outside_guild_ids_does_not", func(o *discord.Options) { o.GuildIDs = []string{other} }, func(*discordtest.ClickSpec) {}, false},
	}
	for _, tt := range tests {
		for _, via := range []string{"HTTP", "gateway"} {
			t.Run(tt.name+"_over_"+via, func(t *testing.T) {
				t.Parallel()
				fake := discordtest.New(t)
				c, _ := newConnector(t, fake, tt.opts)
				question := askQuestion(t, fake, c)
				spec := clickSpec(question, "3401")
				tt.mutate(&spec)
				sink := newSink()
				var typ, flags int
				if via == "HTTP" {
					body, _ := fake.ClickInteraction(spec)
					status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body))
					if status != 200 {
						t.Fatalf("click answered %d %s, want 200 with an answer Discord shows", status, answer)
					}
					typ, flags, _ = decoded(t, answer)
				} else {
					run(t, c, sink)
					connected(t, fake, c)
					fake.Click(spec)
					cb := fake.WaitCallbacks(t, 1)[0]
					typ, flags = cb.Type, cb.Flags
				}
				calls := sink.acceptCalls()
				if !tt.decides {
					if len(calls) != 0 {
						t.Errorf("the click reached the sink: %v", sink.messages())
					}
					if typ != 4 || flags != 64 {
						t.Errorf("answered type %d flags %d, want an ephemeral note (type 4, flags 64)", typ, flags)
					}
					return
				}
				if typ != 6 || len(calls) != 1 {
					t.Fatalf("answered type %d after %d Accepts, want 6 after one", typ, len(calls))
				}
				checkDecision(t, sink.messages()[0], "3401", question)
			})
		}
	}
}

// madeUp is a message with one button berth did not make.
func madeUp(id, customID string) discordtest.Post {
	return discordtest.Post{ID: id, Content: "click me", Components: []discordtest.Row{{Type: 1, Buttons: []discordtest.Button{{Type: 2, Style: 1, Label: "Yes", CustomID: customID}}}}}
}

func TestWithoutABotTokenTheDecisionsReplyIsAFollowUpOfTheClick(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, func(o *discord.Options) { o.BotToken = "" })
	question := madeUp("900000000000000042", connector.ChoiceValue(approvalID, connector.DecideAllowOnce))
	body, token := fake.ClickInteraction(clickSpec(question, "3501"))
	sink := newSink()
	if status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 || answer != `{"type":6}` {
		t.Fatalf("click answered %d %s", status, answer)
	}
	m := sink.messages()[0]
	if err := c.Send(context.Background(), connector.Reply{RunID: "r", MessageID: m.ID, Channel: m.Channel, Text: "Allowed once by bob.", Meta: m.Meta}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if p := fake.Posts()[0]; p.Webhook != fake.AppID+"/"+token {
		t.Errorf("reply %+v, want a follow-up of the click's interaction", p)
	}
}

// hookSink runs hook at the start of every Accept.
type hookSink struct {
	*recordingSink
	hook func(connector.Message)
}

func (s *hookSink) Accept(ctx context.Context, m connector.Message) error {
	s.hook(m)
	return s.recordingSink.Accept(ctx, m)
}

// A guild click carries the clicker's roles from the signed interaction
// (approvers may name a role); a DM click has none.
func TestAClickCarriesTheClickersRoles(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, _ := newConnector(t, fake, nil)
	question := askQuestion(t, fake, c)
	spec := clickSpec(question, "3171")
	spec.Roles = []string{"700000000000000001", "700000000000000002"}
	body, _ := fake.ClickInteraction(spec)
	sink := newSink()
	if status, answer := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 || answer != `{"type":6}` {
		t.Fatalf("click answered %d %s", status, answer)
	}
	dm := clickSpec(question, "3172")
	dm.Guild, dm.Channel, dm.Roles = "", dmID, []string{"700000000000000001"}
	body, _ = fake.ClickInteraction(dm)
	if status, _ := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 {
		t.Fatalf("DM click answered %d", status)
	}
	m := sink.messages()
	if len(m) != 2 || strings.Join(m[0].AuthorGroups, ",") != "role:700000000000000001,role:700000000000000002" || len(m[1].AuthorGroups) != 0 {
		t.Fatalf("groups: %+v / %+v, want the guild click's roles and none in a DM", m[0].AuthorGroups, m[1].AuthorGroups)
	}
}
