package slack

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	slackapi "github.com/slack-go/slack"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Approval buttons (issue 26). A reply with a Question is posted with Block
// Kit blocks: its text in a section and an actions block with a button per
// choice, whose value is connector.ChoiceValue. A click comes back as a
// block_actions interaction — an "interactive" envelope in Socket Mode, or
// a signed form POST (payload=…) to the Interactivity Request URL in events
// mode, which may be the same /hooks/{id} as the events — and becomes a
// Message with Decision set and the clicker's user id as AuthorID, which
// intake stores before the interaction is acknowledged. berth never decides
// here: the scheduler does, for [[approvers]] only.

// sectionLimit is the most text a section block takes.
const sectionLimit = 3000

// questionBlocks are the blocks of the chunk text that carries q.
func questionBlocks(text string, q *connector.Question) slackapi.MsgOption {
	if len([]rune(text)) > sectionLimit {
		text = string([]rune(text)[:sectionLimit-1]) + "…"
	}
	section := slackapi.NewSectionBlock(slackapi.NewTextBlockObject(slackapi.MarkdownType, text, false, false), nil, nil)
	var buttons []slackapi.BlockElement
	for _, choice := range q.Choices {
		b := slackapi.NewButtonBlockElement("berth_approval_"+choice, connector.ChoiceValue(q.ID, choice),
			slackapi.NewTextBlockObject(slackapi.PlainTextType, connector.ChoiceLabel(choice), false, false))
		switch choice {
		case connector.DecideAllowOnce:
			b = b.WithStyle(slackapi.StylePrimary)
		case connector.DecideDeny:
			b = b.WithStyle(slackapi.StyleDanger)
		}
		buttons = append(buttons, b)
	}
	actions := slackapi.NewActionBlock("berth_approval", buttons...)
	return slackapi.MsgOptionBlocks(section, actions)
}

// interaction hands one block_actions payload's berth button click to sink
// as a decision. It returns nil when the click was stored or is not
// berth's (acknowledge it), an error wrapping errBadPayload for bad input,
// and any other error when Accept failed (do not acknowledge).
func (c *Connector) interaction(ctx context.Context, sink connector.Sink, payload []byte, via string) error {
	c.sawEvent()
	var ic slackapi.InteractionCallback
	if err := json.Unmarshal(payload, &ic); err != nil {
		return fmt.Errorf("%w: interaction: %v", errBadPayload, err)
	}
	if ic.Type != slackapi.InteractionTypeBlockActions {
		c.log.Info("ignored a Slack interaction: berth has only approval buttons", "type", ic.Type, "via", via)
		return nil
	}
	var d connector.Decision
	var actionTS string
	found := false
	for _, a := range ic.ActionCallback.BlockActions {
		if a != nil {
			if d, found = connector.ParseChoice(a.Value); found {
				actionTS = a.ActionTs
				break
			}
		}
	}
	channel := ic.Container.ChannelID
	if channel == "" {
		channel = ic.Channel.ID
	}
	if !found || ic.User.ID == "" || channel == "" {
		c.log.Info("ignored a Slack interaction that is no click on a berth button", "via", via)
		return nil
	}
	thread := ic.Container.ThreadTs
	if thread == "" {
		thread = ic.Message.ThreadTimestamp
	}
	if thread == "" {
		thread = ic.Container.MessageTs
	}
	if actionTS == "" {
		actionTS = ic.ActionTs
	}
	author := ic.User.Name
	if author == "" {
		author = ic.User.ID
	}
	m := connector.Message{
		Connector: c.id,
		// One click, one message: a redelivered envelope is a duplicate.
		ID:       "action:" + channel + ":" + ic.Container.MessageTs + ":" + actionTS + ":" + ic.User.ID,
		Channel:  channel,
		Server:   ic.Team.ID,
		Thread:   thread,
		Author:   author,
		AuthorID: ic.User.ID, // from Slack's signed (or socket) payload only
		// The user groups Slack says the clicker is in.
		AuthorGroups: c.userGroups(ctx, ic.User.ID),
		Decision:     &d,
		Text:         d.Decision + " " + d.ApprovalID,
		// The question the decision's reply takes the place of.
		Meta: map[string]string{connector.MetaQuestion: ic.Container.MessageTs},
	}
	if err := sink.Accept(ctx, m); err != nil {
		c.log.Warn("intake did not accept a Slack button click; Slack will deliver it again", "approval_id", d.ApprovalID, "error", c.errText(err))
		return fmt.Errorf("cannot hand the click to intake: %w", err)
	}
	c.status.Healthy()
	c.log.Info("accepted a Slack approval click", "approval_id", d.ApprovalID, "decision", d.Decision, "user", ic.User.ID, "via", via)
	return nil
}

// decideQuestion turns the question a decision answers into the decision
// (chat.update: its text, no buttons) and reports whether it did; where it
// cannot (the question is gone, or this is no decision's reply) the reply
// is posted as any other.
func (c *Connector) decideQuestion(ctx context.Context, r connector.Reply) bool {
	ts := r.Meta[connector.MetaQuestion]
	if r.Meta[connector.MetaDecided] != "true" || ts == "" || len(r.Files) > 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	text := r.Text
	if len([]rune(text)) > MessageLimit {
		text = string([]rune(text)[:MessageLimit-1]) + "…"
	}
	if _, _, _, err := c.api.UpdateMessageContext(ctx, r.Channel, ts, slackapi.MsgOptionText(text, false), slackapi.MsgOptionBlocks()); err != nil {
		c.log.Info("cannot turn the question into its decision; the decision is posted instead", "run_id", r.RunID, "error", c.errText(err))
		return false
	}
	return true
}

// User groups as approvers: [[approvers]] may name a Slack user group
// ("slack:usergroup:S0123ABC"). No event says which groups a user is in;
// usergroups.list with include_users does (scope usergroups:read), one
// call for the workspace, kept userGroupsFresh. Without the scope, or when
// Slack fails, the decision goes on with no groups: only user ids count.

// userGroupsFresh is how long a read of the workspace's groups is used.
const userGroupsFresh = time.Minute

type userGroupCache struct {
	mu     sync.Mutex
	at     time.Time
	byUser map[string][]string
}

// userGroups are the user groups user is in, as "usergroup:<id>".
func (c *Connector) userGroups(ctx context.Context, user string) []string {
	now := c.clock.Now()
	c.groups.mu.Lock()
	if c.groups.byUser != nil && now.Sub(c.groups.at) <= userGroupsFresh {
		defer c.groups.mu.Unlock()
		return slices.Clone(c.groups.byUser[user])
	}
	c.groups.mu.Unlock()
	// Not under the lock: two clicks at once may both ask.
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	groups, err := c.api.GetUserGroupsContext(ctx, slackapi.GetUserGroupsOptionIncludeUsers(true))
	cancel()
	if err != nil {
		c.log.Warn("cannot read the workspace's user groups (scope usergroups:read?): only user ids decide approvals", "error", c.errText(err))
		return nil
	}
	byUser := map[string][]string{}
	for _, g := range groups {
		for _, u := range g.Users {
			byUser[u] = append(byUser[u], "usergroup:"+g.ID)
		}
	}
	c.groups.mu.Lock()
	c.groups.byUser, c.groups.at = byUser, now
	c.groups.mu.Unlock()
	return slices.Clone(byUser[user])
}
