package discordtest

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// User is a message author.
type User struct {
	ID       string
	Username string
	Bot      bool
}

// Channel is a guild channel or thread for GUILD_CREATE.
type Channel struct {
	ID, Name, ParentID string
	Thread             bool
}

// MessageSpec describes a MESSAGE_CREATE.
type MessageSpec struct {
	ID, Channel, Guild string // Guild "" is a DM
	Author             User
	Content            string
	MentionBot         bool // adds the bot to mentions and <@bot> to the content
	Attachments        []string
	// Webhook makes it a message a webhook posted (webhook_id set); Author
	// is then the name and id the poster chose.
	Webhook string
}

// Message is the MESSAGE_CREATE payload of spec (resources/message.mdx).
func (s *Server) Message(m MessageSpec) map[string]any {
	content := m.Content
	mentions := []any{}
	if m.MentionBot {
		content = "<@" + s.BotID + "> " + content
		mentions = append(mentions, map[string]any{"id": s.BotID, "username": "berth-bot", "bot": true})
	}
	atts := []any{}
	for i, a := range m.Attachments {
		atts = append(atts, map[string]any{"id": strconv.Itoa(i + 1), "filename": a, "url": "https://cdn.example.invalid/" + a, "size": 1})
	}
	d := map[string]any{
		"id": m.ID, "channel_id": m.Channel, "type": 0, "content": content,
		"author":      map[string]any{"id": m.Author.ID, "username": m.Author.Username, "bot": m.Author.Bot},
		"mentions":    mentions,
		"embeds":      []any{},
		"attachments": atts,
		"timestamp":   time.Now().UTC().Format(time.RFC3339),
	}
	if m.Guild != "" {
		d["guild_id"] = m.Guild
	}
	if m.Webhook != "" {
		d["webhook_id"] = m.Webhook
	}
	return d
}

// MessageCreate dispatches a MESSAGE_CREATE and returns its sequence number.
func (s *Server) MessageCreate(m MessageSpec) int64 {
	return s.Dispatch("MESSAGE_CREATE", s.Message(m))
}

// GuildCreate dispatches a GUILD_CREATE with channels and threads.
func (s *Server) GuildCreate(guild string, chs ...Channel) int64 {
	var channels, threads []any
	for _, c := range chs {
		v := map[string]any{"id": c.ID, "name": c.Name, "guild_id": guild, "type": 0}
		if c.Thread {
			v["type"], v["parent_id"] = 11, c.ParentID
			threads = append(threads, v)
			continue
		}
		channels = append(channels, v)
	}
	s.mu.Lock()
	for _, list := range [][]any{channels, threads} {
		for _, v := range list {
			c := v.(map[string]any)
			s.channels[c["id"].(string)] = c
		}
	}
	s.mu.Unlock()
	return s.Dispatch("GUILD_CREATE", map[string]any{"id": guild, "name": "guild " + guild, "channels": channels, "threads": threads})
}

// Sign is the hex Ed25519 signature Discord puts in X-Signature-Ed25519.
func (s *Server) Sign(timestamp string, body []byte) string {
	return hex.EncodeToString(ed25519.Sign(s.privateKey, append([]byte(timestamp), body...)))
}

// SignedRequest is an interaction POST to url signed as Discord signs it.
func (s *Server) SignedRequest(url string, body []byte) *http.Request {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Signature-Timestamp", ts)
	req.Header.Set("X-Signature-Ed25519", s.Sign(ts, body))
	return req
}

// Ping is a PING interaction body.
func (s *Server) Ping() []byte {
	b, _ := json.Marshal(map[string]any{"id": "300000000000000001", "application_id": s.AppID, "type": 1, "token": "ping-token", "version": 1})
	return b
}

// CommandSpec describes an APPLICATION_COMMAND interaction.
type CommandSpec struct {
	ID, Channel, Guild string
	User               User
	Name               string
	Options            map[string]string // string options
	ThreadParent       string            // the channel is a thread of this channel
}

// Command is an APPLICATION_COMMAND interaction body and its token.
func (s *Server) Command(c CommandSpec) (body []byte, token string) {
	token = "interaction-token." + randomHex(16)
	var opts []any
	for k, v := range c.Options {
		opts = append(opts, map[string]any{"name": k, "type": 3, "value": v})
	}
	user := map[string]any{"id": c.User.ID, "username": c.User.Username}
	ch := map[string]any{"id": c.Channel, "type": 0, "name": "general"}
	if c.ThreadParent != "" {
		ch["type"], ch["parent_id"], ch["name"] = 11, c.ThreadParent, "a thread"
	}
	in := map[string]any{
		"id": c.ID, "application_id": s.AppID, "type": 2, "token": token, "version": 1,
		"channel_id": c.Channel, "channel": ch,
		"data": map[string]any{"id": "400000000000000001", "name": c.Name, "type": 1, "options": opts},
	}
	if c.Guild != "" {
		in["guild_id"] = c.Guild
		in["member"] = map[string]any{"user": user}
	} else {
		in["user"] = user
	}
	body, _ = json.Marshal(in)
	return body, token
}
