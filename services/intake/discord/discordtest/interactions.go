package discordtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// Button clicks as discord-api-docs documents them
// (interactions/receiving-and-responding.mdx): a MESSAGE_COMPONENT
// interaction (type 3) names the clicker (member.user in a guild, user in
// a DM), data {custom_id, component_type} and the message the button is on;
// it goes to the Interactions Endpoint URL (ClickInteraction, signed with
// SignedRequest) or, without one, over the Gateway as INTERACTION_CREATE
// (Click), answered with POST /interactions/{id}/{token}/callback within 3
// seconds, once: the fake answers an unknown or expired interaction 404
// Unknown interaction (code 10062) and a second answer 400 (code 40060).

// interactionWindow is how long an interaction takes its first answer.
const interactionWindow = 3 * time.Second

// ClickSpec describes a click on a button of a message.
type ClickSpec struct {
	ID, Channel, Guild string // Guild "" is a DM
	User               User
	// On is the message the button is on (a Post berth made, or one made
	// up); CustomID the button's custom_id.
	On       Post
	CustomID string
	// ComponentType is data.component_type; 0 means a button (2).
	ComponentType int
	ThreadParent  string // the channel is a thread of this channel
	// MessageUser is the user whose command the message answered
	// (interaction_metadata.user): not the clicker.
	MessageUser *User
	// Roles are the clicking member's role ids (guild only).
	Roles []string
}

// Callback is one interaction response berth sent.
type Callback struct {
	Interaction string // the interaction's id
	Token       string
	Type        int
	Content     string
	Flags       int
	Authority   string // the Authorization header
}

type issuedInteraction struct {
	at       time.Time
	answered bool
}

// ClickInteraction is a MESSAGE_COMPONENT interaction body and its token.
func (s *Server) ClickInteraction(c ClickSpec) (body []byte, token string) {
	token = "interaction-token." + randomHex(16)
	user := map[string]any{"id": c.User.ID, "username": c.User.Username, "bot": c.User.Bot}
	ch := map[string]any{"id": c.Channel, "type": 0, "name": "general"}
	if c.ThreadParent != "" {
		ch["type"], ch["parent_id"], ch["name"] = 11, c.ThreadParent, "a thread"
	}
	if c.Guild == "" {
		ch["type"] = 1
	}
	ct := c.ComponentType
	if ct == 0 {
		ct = 2
	}
	msg := map[string]any{
		"id": c.On.ID, "channel_id": c.Channel, "type": 0, "content": c.On.Content,
		"author":     map[string]any{"id": s.BotID, "username": "berth-bot", "bot": true},
		"components": c.On.Components,
	}
	if c.MessageUser != nil {
		msg["interaction_metadata"] = map[string]any{"id": "300000000000000077", "type": 2,
			"user": map[string]any{"id": c.MessageUser.ID, "username": c.MessageUser.Username}}
	}
	in := map[string]any{
		"id": c.ID, "application_id": s.AppID, "type": 3, "token": token, "version": 1,
		"channel_id": c.Channel, "channel": ch, "message": msg,
		"data": map[string]any{"custom_id": c.CustomID, "component_type": ct},
	}
	if c.Guild != "" {
		in["guild_id"] = c.Guild
		roles := c.Roles
		if roles == nil {
			roles = []string{}
		}
		in["member"] = map[string]any{"user": user, "roles": roles}
	} else {
		in["user"] = user
	}
	s.mu.Lock()
	s.interactions[c.ID+"/"+token] = &issuedInteraction{at: time.Now()}
	s.mu.Unlock()
	body, _ = json.Marshal(in)
	return body, token
}

// Click dispatches a click as INTERACTION_CREATE over the Gateway and
// returns its token.
func (s *Server) Click(c ClickSpec) string {
	body, token := s.ClickInteraction(c)
	s.Dispatch("INTERACTION_CREATE", json.RawMessage(body))
	return token
}

// Callbacks lists the interaction responses berth sent, in order.
func (s *Server) Callbacks() []Callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.callbacks)
}

// WaitCallbacks waits until n interaction responses were sent.
func (s *Server) WaitCallbacks(t testing.TB, n int) []Callback {
	t.Helper()
	s.WaitFor(t, fmt.Sprintf("%d interaction callbacks", n), func() bool { return len(s.Callbacks()) >= n })
	return s.Callbacks()
}

func (s *Server) interactionCallback(w http.ResponseWriter, r *http.Request) {
	id, token := r.PathValue("id"), r.PathValue("token")
	var b struct {
		Type int `json:"type"`
		Data *struct {
			Content string `json:"content"`
			Flags   int    `json:"flags"`
		} `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b); err != nil || b.Type == 0 {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.interactions[id+"/"+token]
	switch {
	case !ok || time.Since(in.at) > interactionWindow:
		reply(w, http.StatusNotFound, map[string]any{"message": "Unknown interaction", "code": 10062})
		return
	case in.answered:
		reply(w, http.StatusBadRequest, map[string]any{"message": "Interaction has already been acknowledged.", "code": 40060})
		return
	}
	in.answered = true
	cb := Callback{Interaction: id, Token: token, Type: b.Type, Authority: r.Header.Get("Authorization")}
	if b.Data != nil {
		cb.Content, cb.Flags = b.Data.Content, b.Data.Flags
	}
	s.callbacks = append(s.callbacks, cb)
	s.notify()
	w.WriteHeader(http.StatusNoContent)
}
