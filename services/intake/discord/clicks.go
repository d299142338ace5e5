package discord

// A button's click (buttons.go made the button) is a MESSAGE_COMPONENT
// interaction, over the Interactions endpoint or the Gateway. It becomes a
// Message with a Decision from the person who clicked, as Discord signed
// it (the endpoint's Ed25519 signature, the bot's Gateway connection), and
// is acknowledged only once the sink stored it.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Answers to a click that decides nothing; each is shown to the clicker
// alone.
const (
	notABerthButton = "This is not a berth button; nothing was decided."
	notAPerson      = "Only a person's click can decide; nothing was decided."
	notThisServer   = "This bot does not answer in this server."
	clickNotTaken   = "berth could not take your click; nothing was decided. Try again."
)

// interactionCallbackTimeout bounds the answer to a Gateway interaction:
// Discord drops an interaction not answered within three seconds.
const interactionCallbackTimeout = 3 * time.Second

// componentInteraction is a MESSAGE_COMPONENT interaction (type 3) as far as
// berth reads it (interactions/receiving-and-responding.mdx). It is its own
// type rather than discordgo's Interaction, whose decoding of the clicked
// message fails on any component type discordgo does not know.
type componentInteraction struct {
	ID        string             `json:"id"`
	AppID     string             `json:"application_id"`
	Type      int                `json:"type"`
	Token     string             `json:"token"`
	GuildID   string             `json:"guild_id"`
	ChannelID string             `json:"channel_id"`
	Channel   *discordgo.Channel `json:"channel"`
	// Member is set in a guild, User in a DM: who clicked, as Discord
	// signed it.
	Member *struct {
		User  *discordgo.User `json:"user"`
		Roles []string        `json:"roles"`
	} `json:"member"`
	User *discordgo.User `json:"user"`
	Data struct {
		CustomID      string `json:"custom_id"`
		ComponentType int    `json:"component_type"`
	} `json:"data"`
	// Message is the message the button is on.
	Message *struct {
		ID         string `json:"id"`
		Components []struct {
			Type       int `json:"type"`
			Components []struct {
				Type     int    `json:"type"`
				CustomID string `json:"custom_id"`
			} `json:"components"`
		} `json:"components"`
	} `json:"message"`
}

// clicker is who clicked: member.user in a guild, user in a DM, never
// anything the message says.
func (in *componentInteraction) clicker() *discordgo.User {
	if in.GuildID != "" {
		if in.Member == nil {
			return nil
		}
		return in.Member.User
	}
	return in.User
}

// onClickedMessage tells whether the clicked button is on the message the
// interaction names, as Discord sent it.
func (in *componentInteraction) onClickedMessage() bool {
	if in.Message == nil {
		return false
	}
	for _, row := range in.Message.Components {
		if row.Type != componentActionRow {
			continue
		}
		for _, b := range row.Components {
			if b.Type == componentButton && b.CustomID == in.Data.CustomID {
				return true
			}
		}
	}
	return false
}

func ephemeral(text string) discordgo.InteractionResponse {
	return discordgo.InteractionResponse{
		Type: discordgo.InteractionResponseChannelMessageWithSource,
		Data: &discordgo.InteractionResponseData{Content: text, Flags: discordgo.MessageFlagsEphemeral},
	}
}

// click hands a button's click to the sink as a Decision and returns the
// interaction's answer: DEFERRED_UPDATE_MESSAGE (type 6) once the sink
// stored it, else an ephemeral message that says why nothing was decided.
func (c *Connector) click(ctx context.Context, sink connector.Sink, in *componentInteraction) discordgo.InteractionResponse {
	log := c.log.With("interaction_id", in.ID)
	if in.GuildID != "" && len(c.guilds) > 0 && !c.guilds[in.GuildID] {
		log.Info("discord click from a guild not in guild_ids; answered and ignored")
		return ephemeral(notThisServer)
	}
	decision, ok := connector.ParseChoice(in.Data.CustomID)
	if !ok || in.Data.ComponentType != componentButton || !in.onClickedMessage() {
		log.Warn("discord click on something that is no berth approval button; nothing decided", "component_type", in.Data.ComponentType)
		return ephemeral(notABerthButton)
	}
	user := in.clicker()
	if user == nil || user.ID == "" || personID(user, "") == "" {
		log.Warn("discord click by a bot or by nobody named; nothing decided")
		return ephemeral(notAPerson)
	}
	msg := connector.Message{
		Connector: c.id,
		ID:        interactionIDPrefix + in.ID,
		Channel:   in.ChannelID,
		Server:    in.GuildID,
		Author:    cmpOr(user.Username, user.ID),
		AuthorID:  user.ID,
		Decision:  &decision,
		// The clicker's roles, from the same signed interaction.
		AuthorGroups: in.roles(),
		Meta: map[string]string{
			MetaAuthorID:     user.ID,
			MetaReplyChannel: in.ChannelID,
			MetaReplyTo:      in.Message.ID,
			// The question the decision's reply takes the place of.
			connector.MetaQuestion: in.Message.ID,
		},
	}
	if in.GuildID == "" {
		msg.Meta[MetaDM] = "true"
	}
	if c.o.BotToken == "" {
		// No bot to post with: the answer goes as a follow-up of the click.
		msg.Meta[MetaInteractionToken], msg.Meta[MetaApplicationID] = in.Token, in.AppID
	}
	c.placeInThread(&msg, in.Channel)
	actx, cancel := context.WithTimeout(ctx, interactionAcceptTimeout)
	defer cancel()
	if err := sink.Accept(actx, msg); err != nil {
		log.Warn("cannot hand the click to intake; the clicker is asked to click again", "error", err)
		c.status.Failed(fmt.Errorf("cannot store the click of interaction %s: %w", in.ID, err))
		return ephemeral(clickNotTaken)
	}
	c.status.Healthy()
	log.Info("discord approval click accepted", "approval_id", decision.ApprovalID, "decision", decision.Decision, "user_id", user.ID)
	return discordgo.InteractionResponse{Type: discordgo.InteractionResponseDeferredMessageUpdate}
}

// placeInThread sets a message's Channel, Thread and ChannelName from the
// interaction's channel object (which tells a thread and its parent), else
// from the channel cache, as a message in that channel gets them.
func (c *Connector) placeInThread(msg *connector.Message, ch *discordgo.Channel) {
	channelID := msg.Channel
	var info channelInfo
	if ch != nil {
		info = channelInfo{name: ch.Name, parent: ch.ParentID, thread: ch.IsThread()}
	} else if cached, ok := c.channel(channelID); ok {
		info = cached
	}
	msg.ChannelName = info.name
	if info.thread && info.parent != "" {
		msg.Thread, msg.Channel = channelID, info.parent
		msg.ChannelName = ""
		if parent, ok := c.channel(info.parent); ok {
			msg.ChannelName = parent.name
		}
	}
}

// onInteraction handles an INTERACTION_CREATE from the Gateway, which
// Discord sends there when the application has no Interactions Endpoint
// URL: a click is answered with POST /interactions/{id}/{token}/callback.
// It never drops the connection: a click not taken is answered so, and the
// person clicks again (Discord would not take a late answer anyway).
func (c *Connector) onInteraction(ctx context.Context, sink connector.Sink, raw json.RawMessage) {
	var in componentInteraction
	if err := json.Unmarshal(raw, &in); err != nil || in.ID == "" || in.Token == "" {
		c.log.Warn("discord gateway sent a malformed INTERACTION_CREATE; ignored")
		return
	}
	if in.Type != int(discordgo.InteractionMessageComponent) {
		c.log.Debug("discord gateway interaction not handled; ignored", "type", in.Type, "interaction_id", in.ID)
		return
	}
	if c.o.ApplicationID != "" && in.AppID != c.o.ApplicationID {
		c.log.Warn("discord gateway interaction for another application; ignored", "interaction_id", in.ID)
		return
	}
	resp := c.click(ctx, sink, &in)
	if err := c.answerInteraction(ctx, in.ID, in.Token, resp); err != nil {
		c.log.Warn("cannot answer the discord interaction", "interaction_id", in.ID, "error", err)
	}
}

// answerInteraction posts an interaction's response; the route names the
// interaction, never its token.
func (c *Connector) answerInteraction(ctx context.Context, id, token string, resp discordgo.InteractionResponse) error {
	ctx, cancel := context.WithTimeout(ctx, interactionCallbackTimeout)
	defer cancel()
	path := "/interactions/" + url.PathEscape(id) + "/" + url.PathEscape(token) + "/callback"
	_, err := c.call(ctx, http.MethodPost, "POST /interactions/"+id+"/callback", path, resp, false, token)
	return err
}

// decideQuestion turns the question a decision answers into the decision
// (its text, no buttons) and reports whether it did; where it cannot (the
// question is gone, or this is no decision's reply) the reply is posted as
// any other.
func (c *Connector) decideQuestion(ctx context.Context, r connector.Reply) bool {
	id, channel := r.Meta[connector.MetaQuestion], r.Meta[MetaReplyChannel]
	if r.Meta[connector.MetaDecided] != "true" || id == "" || channel == "" || len(r.Files) > 0 {
		return false
	}
	text := r.Text
	if utf8.RuneCountInString(text) > MessageLimit {
		text = string([]rune(text)[:MessageLimit-1]) + "…"
	}
	body := map[string]any{"content": text, "components": []any{}, "allowed_mentions": noMentions}
	if _, err := c.call(ctx, http.MethodPatch, "PATCH /channels/"+channel+"/messages",
		"/channels/"+url.PathEscape(channel)+"/messages/"+url.PathEscape(id), body, true); err != nil {
		c.log.Info("cannot turn the question into its decision; the decision is posted instead", "run_id", r.RunID, "error", err)
		return false
	}
	return true
}

// roles are the clicking member's role ids, from the signed interaction;
// none in a DM.
func (in *componentInteraction) roles() []string {
	if in.GuildID == "" || in.Member == nil {
		return nil
	}
	return memberRoles(in.GuildID, &discordgo.Member{Roles: in.Member.Roles})
}

// memberRoles are a guild member's roles as AuthorGroups name them,
// "role:<id>" ([[approvers]]: "discord:role:<id>"); none outside a guild.
func memberRoles(guild string, m *discordgo.Member) []string {
	if guild == "" || m == nil || len(m.Roles) == 0 {
		return nil
	}
	out := make([]string, len(m.Roles))
	for i, r := range m.Roles {
		out[i] = "role:" + r
	}
	return out
}
