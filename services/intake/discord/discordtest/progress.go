package discordtest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// Message edits, deletes and reactions as discord-api-docs documents them
// (resources/message.mdx): PATCH /channels/{channel.id}/messages/{message.id}
// with {"content"} (at most 2,000 characters), DELETE of the same path (204;
// 404 Unknown Message, code 10008, when it is gone), and PUT
// /channels/{channel.id}/messages/{message.id}/reactions/{emoji}/@me (204).
// Edits and deletes count against a per-channel limit of 5 per 5 s
// (topics/rate-limits.mdx): a sixth within the window is answered 429, and
// counted in Overruns, so a test can tell berth never met it. Times are
// the fake's clock (SetClock), a test's fake clock when it sets one.

// messageWindow and messagesPerWindow are the per-channel message limit.
const (
	messageWindow     = 5 * time.Second
	messagesPerWindow = 5
)

// Edit is one message edit or delete berth made.
type Edit struct {
	Channel, Message string
	Content          string // "" for a delete
	Deleted          bool
	At               time.Time // on the fake's clock
}

// Reaction is one reaction berth added.
type Reaction struct {
	Channel, Message, Emoji string
}

type progressState struct {
	now       func() time.Time
	edits     []Edit
	deleted   map[string]bool
	reactions []Reaction
	calls     map[string][]time.Time // channel → message calls in the window
	overruns  int
	// noReactions are channels where the bot lacks Add Reactions: PUT
	// reactions answers 403 Missing Permissions (code 50013).
	noReactions      map[string]bool
	refusedReactions int
	failDeletes      int // the next deletes answered 500
	failedDeletes    int
}

func (s *Server) handleProgress(mux *http.ServeMux) {
	s.progress = progressState{now: time.Now, deleted: map[string]bool{}, calls: map[string][]time.Time{}}
	mux.HandleFunc("PATCH /api/v10/channels/{channel}/messages/{message}", s.editMessage)
	mux.HandleFunc("DELETE /api/v10/channels/{channel}/messages/{message}", s.deleteMessage)
	mux.HandleFunc("PUT /api/v10/channels/{channel}/messages/{message}/reactions/{emoji}/@me", s.addReaction)
}

// SetClock makes the fake read time from now (a test's fake clock).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	s.progress.now = now
	s.mu.Unlock()
}

// Edits lists the edits and deletes, in order.
func (s *Server) Edits() []Edit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.progress.edits)
}

// DenyReactions takes the Add Reactions permission from the bot in
// channel: a reaction there is answered 403 {"message": "Missing
// Permissions", "code": 50013}, as discord-api-docs documents.
func (s *Server) DenyReactions(channel string) {
	s.mu.Lock()
	if s.progress.noReactions == nil {
		s.progress.noReactions = map[string]bool{}
	}
	s.progress.noReactions[channel] = true
	s.mu.Unlock()
}

// FailDeletes makes the next n message deletes fail with 500 Internal
// Server Error (a Discord outage: the client may retry).
func (s *Server) FailDeletes(n int) {
	s.mu.Lock()
	s.progress.failDeletes = n
	s.mu.Unlock()
}

// FailedDeletes counts deletes answered 500.
func (s *Server) FailedDeletes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.failedDeletes
}

// RefusedReactions counts reactions answered 403.
func (s *Server) RefusedReactions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.refusedReactions
}

// Reactions lists the reactions added, in order.
func (s *Server) Reactions() []Reaction {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.progress.reactions)
}

// Overruns counts message calls answered 429 by the per-channel limit.
func (s *Server) Overruns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.overruns
}

// Deleted tells whether the message id was deleted.
func (s *Server) Deleted(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.deleted[id]
}

// overChannelLimitLocked counts a message call on channel (s.mu held) and tells
// whether it is over the per-channel limit.
func (s *Server) overChannelLimitLocked(channel string) bool {
	now := s.progress.now()
	recent := s.progress.calls[channel][:0]
	for _, at := range s.progress.calls[channel] {
		if now.Sub(at) < messageWindow {
			recent = append(recent, at)
		}
	}
	if len(recent) >= messagesPerWindow {
		s.progress.calls[channel] = recent
		s.progress.overruns++
		return true
	}
	s.progress.calls[channel] = append(recent, now)
	return false
}

// postedLocked tells whether id is a message the fake made in channel.
func (s *Server) postedLocked(channel, id string) bool {
	n, err := strconv.Atoi(id)
	i := n - 900000000000000000 - 1
	return err == nil && i >= 0 && i < len(s.posts) && s.posts[i].Channel == channel && !s.progress.deleted[id]
}

func (s *Server) editMessage(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	ch, id := r.PathValue("channel"), r.PathValue("message")
	var b struct {
		Content string `json:"content"`
		// Components, when present, replace the message's ([] removes them).
		Components json.RawMessage `json:"components"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b); err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"message": "400: Bad Request", "code": 50109})
		return
	}
	if utf8.RuneCountInString(b.Content) > 2000 {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035})
		return
	}
	rows, ok := readComponents(w, b.Components)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overChannelLimitLocked(ch) {
		w.Header().Set("Retry-After", "1")
		reply(w, http.StatusTooManyRequests, map[string]any{"message": "You are being rate limited.", "retry_after": 1.0, "global": false})
		return
	}
	if !s.postedLocked(ch, id) {
		reply(w, http.StatusNotFound, map[string]any{"message": "Unknown Message", "code": 10008})
		return
	}
	s.progress.edits = append(s.progress.edits, Edit{Channel: ch, Message: id, Content: b.Content, At: s.progress.now()})
	for i := range s.posts {
		if s.posts[i].Channel == ch && s.posts[i].ID == id {
			s.posts[i].Content = b.Content
			if b.Components != nil {
				s.posts[i].Components = rows
			}
		}
	}
	s.notify()
	reply(w, http.StatusOK, map[string]any{"id": id, "channel_id": ch, "content": b.Content, "type": 0})
}

func (s *Server) deleteMessage(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	ch, id := r.PathValue("channel"), r.PathValue("message")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.progress.failDeletes > 0 {
		s.progress.failDeletes--
		s.progress.failedDeletes++
		s.notify()
		reply(w, http.StatusInternalServerError, map[string]any{"message": "500: Internal Server Error", "code": 0})
		return
	}
	if s.overChannelLimitLocked(ch) {
		w.Header().Set("Retry-After", "1")
		reply(w, http.StatusTooManyRequests, map[string]any{"message": "You are being rate limited.", "retry_after": 1.0, "global": false})
		return
	}
	if !s.postedLocked(ch, id) {
		reply(w, http.StatusNotFound, map[string]any{"message": "Unknown Message", "code": 10008})
		return
	}
	s.progress.deleted[id] = true
	s.progress.edits = append(s.progress.edits, Edit{Channel: ch, Message: id, Deleted: true, At: s.progress.now()})
	s.notify()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) addReaction(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.progress.noReactions[r.PathValue("channel")] {
		s.progress.refusedReactions++
		s.notify()
		reply(w, http.StatusForbidden, map[string]any{"message": "Missing Permissions", "code": 50013})
		return
	}
	s.progress.reactions = append(s.progress.reactions, Reaction{Channel: r.PathValue("channel"), Message: r.PathValue("message"), Emoji: r.PathValue("emoji")})
	s.notify()
	w.WriteHeader(http.StatusNoContent)
}
