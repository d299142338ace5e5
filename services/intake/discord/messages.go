package discord

import (
	"context"
	"encoding/json"
	"fmt"
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
)

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

// onMessage hands a MESSAGE_CREATE to the sink; an error means it was not
// stored and must not be acknowledged.
func (c *Connector) onMessage(ctx context.Context, sink connector.Sink, raw json.RawMessage, selfID string) error {
	var m discordgo.Message
	if err := json.Unmarshal(raw, &m); err != nil || m.ID == "" || m.ChannelID == "" {
		c.log.Warn("discord gateway sent a malformed MESSAGE_CREATE; ignored")
		return nil
	}
	msg, ok := c.toMessage(&m, selfID)
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
func (c *Connector) toMessage(m *discordgo.Message, selfID string) (connector.Message, bool) {
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
	if !dm && c.o.Trigger == TriggerMention {
		if !mentions(m, selfID) {
			return skip("does not mention the bot")
		}
		text = strings.NewReplacer("<@"+selfID+">", "", "<@!"+selfID+">", "").Replace(text)
	}
	text = strings.TrimSpace(text)
	for _, a := range m.Attachments {
		if a != nil && a.URL != "" {
			text = strings.TrimSpace(text + "\n[attachment " + a.Filename + ": " + a.URL + "]")
		}
	}
	if text == "" {
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
		Text:      text,
		Meta:      map[string]string{MetaAuthorID: m.Author.ID, MetaReplyChannel: m.ChannelID},
	}
	if dm {
		msg.Meta[MetaDM] = "true"
	}
	if ch, ok := c.channel(m.ChannelID); ok {
		msg.ChannelName = ch.name
		if ch.thread && ch.parent != "" {
			msg.Thread = m.ChannelID
			msg.Channel = ch.parent
			if parent, ok := c.channel(ch.parent); ok {
				msg.ChannelName = parent.name
			}
		}
	}
	return msg, true
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
	c.status.Warning = ContentWarning
	c.mu.Unlock()
	if first {
		c.log.Error("discord message arrived without content; the MESSAGE_CONTENT intent is not granted", "message_id", messageID,
			"fix", "Developer Portal → your application → Bot → Privileged Gateway Intents → MESSAGE CONTENT INTENT")
	}
}
