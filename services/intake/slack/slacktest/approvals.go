package slacktest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Block is one Block Kit block of a post: a section's text, an actions
// block's buttons.
type Block struct {
	Type    string   `json:"type"`
	BlockID string   `json:"block_id,omitempty"`
	Text    *Text    `json:"text,omitempty"`
	Buttons []Button `json:"elements,omitempty"`
}

// Text is a text object.
type Text struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Button is a button element.
type Button struct {
	Type     string `json:"type"`
	ActionID string `json:"action_id"`
	Value    string `json:"value"`
	Style    string `json:"style,omitempty"`
	Text     Text   `json:"text"`
}

// Buttons are the buttons of the post's actions blocks, in order.
func (p Post) Buttons() []Button {
	var out []Button
	for _, b := range p.Blocks {
		if b.Type == "actions" {
			out = append(out, b.Buttons...)
		}
	}
	return out
}

// parseBlocks reads chat.postMessage's blocks argument within Block Kit's
// documented limits (at most 50 blocks; a section's text 3000 characters;
// an actions block 25 elements; a button's text 75 characters, action_id
// 255, value 2000); the error code Slack answers otherwise.
func parseBlocks(raw string) ([]Block, string) {
	if raw == "" {
		return nil, ""
	}
	var blocks []Block
	if err := json.Unmarshal([]byte(raw), &blocks); err != nil || len(blocks) == 0 || len(blocks) > 50 {
		return nil, "invalid_blocks_format"
	}
	for _, b := range blocks {
		switch b.Type {
		case "section":
			if b.Text == nil || b.Text.Text == "" || len([]rune(b.Text.Text)) > 3000 {
				return nil, "invalid_blocks"
			}
		case "actions":
			if len(b.Buttons) == 0 || len(b.Buttons) > 25 {
				return nil, "invalid_blocks"
			}
			ids := map[string]bool{}
			for _, e := range b.Buttons {
				if e.Type != "button" || e.ActionID == "" || len(e.ActionID) > 255 || ids[e.ActionID] ||
					len(e.Value) > 2000 || e.Text.Text == "" || len([]rune(e.Text.Text)) > 75 ||
					(e.Style != "" && e.Style != "primary" && e.Style != "danger") {
					return nil, "invalid_blocks"
				}
				ids[e.ActionID] = true
			}
		default:
			return nil, "invalid_blocks"
		}
	}
	return blocks, ""
}

// ClickPayload is the block_actions interaction Slack sends when user
// clicks the button of post p whose value is value.
func (s *Server) ClickPayload(user string, p Post, value string) []byte {
	s.mu.Lock()
	s.seq++
	n := s.seq
	s.mu.Unlock()
	var clicked Button
	for _, b := range p.Buttons() {
		if b.Value == value {
			clicked = b
		}
	}
	actionTS := fmt.Sprintf("%d.%06d", time.Now().Unix(), n)
	container := map[string]any{"type": "message", "message_ts": p.TS, "channel_id": p.Channel, "is_ephemeral": false}
	message := map[string]any{"type": "message", "ts": p.TS, "text": p.Text, "user": s.o.BotUserID, "bot_id": s.o.BotID}
	if p.ThreadTS != "" {
		container["thread_ts"] = p.ThreadTS
		message["thread_ts"] = p.ThreadTS
	}
	body, _ := json.Marshal(map[string]any{
		"type":         "block_actions",
		"user":         map[string]any{"id": user, "username": strings.ToLower(user), "name": strings.ToLower(user), "team_id": s.o.TeamID},
		"api_app_id":   s.o.AppID,
		"token":        "verification-token",
		"container":    container,
		"trigger_id":   fmt.Sprintf("%d.trigger", n),
		"team":         map[string]any{"id": s.o.TeamID, "domain": "berth-test"},
		"channel":      map[string]any{"id": p.Channel, "name": "general"},
		"message":      message,
		"response_url": s.srv.URL + "/actions/response",
		"actions": []map[string]any{{
			"action_id": clicked.ActionID, "block_id": "berth_approval", "value": value,
			"type": "button", "action_ts": actionTS, "text": clicked.Text,
		}},
	})
	return body
}

// Click sends user's click on post p's button with value in an
// "interactive" Socket Mode envelope and returns the envelope id.
func (s *Server) Click(ctx context.Context, user string, p Post, value string) (string, error) {
	return s.DeliverInteraction(ctx, s.ClickPayload(user, p, value))
}

// DeliverInteraction sends payload in an "interactive" envelope.
func (s *Server) DeliverInteraction(ctx context.Context, payload []byte) (string, error) {
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("env-%04d", s.seq)
	s.envelopes[id] = &envelope{kind: "interactive", payload: payload}
	s.mu.Unlock()
	return id, s.sendEnvelope(ctx, id, 0, "")
}

// PostInteraction posts payload to an Interactivity Request URL as Slack
// does at ts: a form with payload=JSON, signed with the signing secret.
func (s *Server) PostInteraction(ctx context.Context, target, secret string, ts time.Time, payload []byte) (int, error) {
	body := []byte(url.Values{"payload": {string(payload)}}.Encode())
	req, err := SignedRequest(ctx, target, secret, ts, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("cannot post the interaction: %w", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// UserGroup is a workspace's user group, as usergroups.list lists it.
type UserGroup struct {
	ID     string   `json:"id"`
	Handle string   `json:"handle"`
	Users  []string `json:"users,omitempty"`
}

// SetUserGroups makes usergroups.list answer groups.
func (s *Server) SetUserGroups(groups ...UserGroup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.userGroups = groups
}

// RefuseUserGroups makes usergroups.list answer error code (Slack answers
// missing_scope to a bot without usergroups:read); "" answers again.
func (s *Server) RefuseUserGroups(code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groupsRefusal = code
}

// UserGroupReads counts usergroups.list calls.
func (s *Server) UserGroupReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.groupReads
}

// userGroupsList is usergroups.list: the users of each group only with
// include_users.
func (s *Server) userGroupsList(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	s.mu.Lock()
	s.groupReads++
	code, groups := s.groupsRefusal, append([]UserGroup(nil), s.userGroups...)
	s.mu.Unlock()
	if code != "" {
		refuse(w, code)
		return
	}
	out := make([]map[string]any, len(groups))
	for i, g := range groups {
		out[i] = map[string]any{"id": g.ID, "team_id": s.o.TeamID, "is_usergroup": true, "handle": g.Handle, "name": g.Handle, "user_count": len(g.Users)}
		if r.PostForm.Get("include_users") == "true" {
			out[i]["users"] = g.Users
		}
	}
	reply(w, map[string]any{"ok": true, "usergroups": out})
}
