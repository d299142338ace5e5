package discord

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/bwmarrin/discordgo"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Meta keys a Message carries back in Reply.Meta.
const (
	MetaDM               = "dm"
	MetaAuthorID         = "author_id"
	MetaReplyChannel     = "reply_channel" // where the run's typing shows: the thread when there is one
	MetaInteractionToken = "interaction_token"
	MetaApplicationID    = "application_id"
	// MetaReplyTo is the message a click's reply refers to: the question.
	MetaReplyTo = "reply_to"
)

// interactionIDPrefix starts the Message.ID of a button's click, which is
// an interaction and no message: "interaction:" + the interaction's id.
const interactionIDPrefix = "interaction:"

// ContentWarning is Status.Warning when messages arrive without content.
const ContentWarning = "messages arrive without content: the MESSAGE_CONTENT intent is not granted; enable MESSAGE CONTENT INTENT under Bot → Privileged Gateway Intents in the Developer Portal"

type channelInfo struct {
	name   string
	parent string
	thread bool
}

func (c *Connector) rememberChannels(chs ...*discordgo.Channel) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range chs {
		if ch == nil || ch.ID == "" {
			continue
		}
		c.channels[ch.ID] = channelInfo{name: ch.Name, parent: ch.ParentID, thread: ch.IsThread()}
	}
}

func (c *Connector) forgetChannel(id string) {
	c.mu.Lock()
	delete(c.channels, id)
	c.mu.Unlock()
}

func (c *Connector) channel(id string) (channelInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.channels[id]
	return ch, ok
}

// guildChannel is the cached guild channel id, else what GET /channels/{id}
// answers (then cached). The cache fills from GUILD_CREATE, which follows
// READY only: a session resumed after a restart starts with an empty one.
// A failed lookup is logged and leaves the message without the channel's
// name and thread parent; one Discord refused is not asked for again.
func (c *Connector) guildChannel(ctx context.Context, id string) (channelInfo, bool) {
	if ch, ok := c.channel(id); ok || c.o.BotToken == "" {
		return ch, ok
	}
	data, err := c.call(ctx, http.MethodGet, "GET /channels/"+id, "/channels/"+url.PathEscape(id), nil, true)
	if err != nil {
		c.log.Warn("cannot look up the discord channel; the message goes on without its name and thread parent", "channel", id, "error", err)
		if connector.IsPermanent(err) {
			// Asking again cannot help (no access, or no such channel).
			c.mu.Lock()
			c.channels[id] = channelInfo{}
			c.mu.Unlock()
		}
		return channelInfo{}, false
	}
	var ch discordgo.Channel
	if err := json.Unmarshal(data, &ch); err != nil || ch.ID != id {
		c.log.Warn("discord answered a channel lookup with something else; ignored", "channel", id)
		return channelInfo{}, false
	}
	c.rememberChannels(&ch)
	return c.channel(id)
}

// onMessage hands a MESSAGE_CREATE to the sink; an error means it was not
// stored and must not be acknowledged.
func (c *Connector) onMessage(ctx context.Context, sink connector.Sink, raw json.RawMessage, selfID string) error {
	var m discordgo.Message
	if err := json.Unmarshal(raw, &m); err != nil || m.ID == "" || m.ChannelID == "" {
		c.log.Warn("discord gateway sent a malformed MESSAGE_CREATE; ignored")
		return nil
	}
	msg, ok := c.toMessage(ctx, &m, selfID)
	if !ok {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, c.o.AcceptTimeout)
	defer cancel()
	if err := sink.Accept(actx, msg); err != nil {
		c.log.Warn("cannot hand the message to intake; resuming so that Discord sends it again", "message_id", m.ID, "error", err)
		return fmt.Errorf("cannot hand message %s to intake: %w", m.ID, err)
	}
	c.log.Debug("discord message accepted", "message_id", m.ID)
	return nil
}

// toMessage filters a Discord message and maps it; false: not for an agent.
func (c *Connector) toMessage(ctx context.Context, m *discordgo.Message, selfID string) (connector.Message, bool) {
	skip := func(why string) (connector.Message, bool) {
		c.log.Debug("discord message ignored", "message_id", m.ID, "reason", why)
		return connector.Message{}, false
	}
	switch {
	case m.Author == nil:
		return skip("no author")
	case m.Author.ID == selfID:
		return skip("own message")
	case m.Author.Bot && !c.o.AllowBots:
		return skip("from a bot")
	case m.Type != discordgo.MessageTypeDefault && m.Type != discordgo.MessageTypeReply:
		return skip("system message")
	}
	dm := m.GuildID == ""
	if !dm && len(c.guilds) > 0 && !c.guilds[m.GuildID] {
		return skip("guild not in guild_ids")
	}
	if m.Content == "" && len(m.Attachments) == 0 && len(m.Embeds) == 0 && len(m.StickerItems) == 0 && m.Poll == nil {
		c.warnNoContent(m.ID)
		return skip("no content")
	}
	text := m.Content
	// A decision on one of berth's approvals is for the bot, mention or not.
	if _, decision := connector.ParseDecision(text); !dm && c.o.Trigger == TriggerMention && !decision {
		if !mentions(m, selfID) {
			return skip("does not mention the bot")
		}
		text = strings.NewReplacer("<@"+selfID+">", "", "<@!"+selfID+">", "").Replace(text)
	}
	text = strings.TrimSpace(text)
	// Attachments are files intake downloads (their CDN links are signed
	// and need no token); the run finds them in its workspace.
	var files []connector.Attachment
	for _, a := range m.Attachments {
		if a != nil && a.URL != "" {
			files = append(files, connector.Attachment{Name: a.Filename, Type: a.ContentType, Size: int64(a.Size), URL: a.URL})
		}
	}
	if text == "" && len(files) == 0 {
		return skip("empty after the mention")
	}
	author := m.Author.Username
	if author == "" {
		author = m.Author.ID
	}
	msg := connector.Message{
		Connector: c.id,
		ID:        m.ID,
		Channel:   m.ChannelID,
		Server:    m.GuildID,
		Author:    author,
		AuthorID:  personID(m.Author, m.WebhookID),
		Text:      text,
		Meta:      map[string]string{MetaAuthorID: m.Author.ID, MetaReplyChannel: m.ChannelID},
		Files:     files,
	}
	if msg.AuthorID != "" {
		msg.AuthorGroups = memberRoles(m.GuildID, m.Member)
	}
	if dm {
		msg.Meta[MetaDM] = "true"
	}
	if dm {
		return msg, true
	}
	if ch, ok := c.guildChannel(ctx, m.ChannelID); ok {
		msg.ChannelName = ch.name
		if ch.thread && ch.parent != "" {
			msg.Thread = m.ChannelID
			msg.Channel = ch.parent
			if parent, ok := c.guildChannel(ctx, ch.parent); ok {
				msg.ChannelName = parent.name
			}
		}
	}
	return msg, true
}

// personID is the Message.AuthorID of u: its snowflake, or "" for a bot or
// a webhook's message (whose author is the webhook, not a person), so
// that neither can ever be taken for an approver.
func personID(u *discordgo.User, webhookID string) string {
	if u == nil || u.Bot || u.System || webhookID != "" {
		return ""
	}
	return u.ID
}

func mentions(m *discordgo.Message, selfID string) bool {
	for _, u := range m.Mentions {
		if u != nil && u.ID == selfID {
			return true
		}
	}
	return strings.Contains(m.Content, "<@"+selfID+">") || strings.Contains(m.Content, "<@!"+selfID+">")
}

// warnNoContent records, once, that content arrives empty: Discord strips it
// without the MESSAGE_CONTENT intent (gateway.mdx, Message Content Intent).
func (c *Connector) warnNoContent(messageID string) {
	c.mu.Lock()
	first := !c.contentWarned
	c.contentWarned = true
	c.mu.Unlock()
	c.status.Warn(ContentWarning)
	if first {
		c.log.Error("discord message arrived without content; the MESSAGE_CONTENT intent is not granted", "message_id", messageID,
			"fix", "Developer Portal → your application → Bot → Privileged Gateway Intents → MESSAGE CONTENT INTENT")
	}
}
