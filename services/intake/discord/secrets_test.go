package discord_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/discord/discordtest"
)

func TestCredentialsNeverReachLogsStatusOrErrors(t *testing.T) {
	t.Parallel()
	fake := discordtest.New(t)
	c, logs := newConnector(t, fake, nil)
	sink := newSink()
	sink.failing(1)
	run(t, c, sink)
	fake.WaitHandshakes(t, 1)
	fake.MessageCreate(discordtest.MessageSpec{ID: "2101", Channel: dmID, Author: alice, Content: "hi"})
	sink.wait(t, 1)

	body, token := fake.Command(discordtest.CommandSpec{ID: "2102", Channel: chanID, Guild: guild, User: alice, Name: "ask"})
	if status, _ := serve(c.Handler(sink), fake.SignedRequest("/hooks/discord-main", body)); status != 200 {
		t.Fatalf("command answered %d", status)
	}
	meta := map[string]string{discord.MetaInteractionToken: token, discord.MetaApplicationID: fake.AppID}
	var errs []error
	fake.Refuse(chanID, discordtest.Refusal{Status: 403, Code: 50001, Message: "Missing Access"})
	errs = append(errs, c.Send(context.Background(), connector.Reply{RunID: "r1", MessageID: "2101", Channel: chanID, Text: "x"}))
	fake.Refuse(fake.AppID, discordtest.Refusal{Status: 404, Code: 10015, Message: "Unknown Webhook"})
	errs = append(errs, c.Send(context.Background(), connector.Reply{RunID: "r2", MessageID: "2102", Text: "x", Meta: meta}))

	// Discord unreachable: transport errors quote the URL, which holds the token.
	gone := httptest.NewServer(nil)
	gone.Close()
	unreachable, unreachableLogs := newConnector(t, fake, func(o *discord.Options) { o.BaseURL = gone.URL })
	errs = append(errs, unreachable.Send(context.Background(), connector.Reply{RunID: "r3", MessageID: "2102", Text: "x", Meta: meta}))

	// A token the gateway rejects.
	const wrong = "wrong-secret-token.abcdef"
	rejected, rejectedLogs := newConnector(t, fake, func(o *discord.Options) { o.BotToken, o.GatewayURL = wrong, fake.GatewayURL })
	run(t, rejected, newSink())
	eventually(t, "the rejection", func() bool { return rejected.Status().Warning != "" })

	for _, secret := range []string{fake.Token, token, wrong} {
		for name, text := range map[string]string{
			"log":    logs.String() + rejectedLogs.String() + unreachableLogs.String(),
			"status": fmt.Sprintf("%+v %+v %+v", c.Status(), unreachable.Status(), rejected.Status()),
			"errors": fmt.Sprint(errs),
		} {
			if strings.Contains(text, secret) {
				t.Errorf("a credential (%.8s…) appears in the %s:\n%s", secret, name, text)
			}
		}
	}
	if !strings.Contains(unreachableLogs.String(), "connection refused") || !strings.Contains(logs.String(), "Unknown Webhook") {
		t.Errorf("the failures were not logged, so the test proves nothing:\n%s\n%s", logs, unreachableLogs)
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("send %d succeeded; the test meant it to fail", i)
		}
	}
}
