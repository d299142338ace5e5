package slacktest

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// chat.update, chat.delete and reactions.add as api.slack.com documents them
// (methods/chat.update: channel, ts, text; message_not_found, cant_update_message,
// msg_too_long; methods/chat.delete: channel, ts; message_not_found;
// methods/reactions.add: channel, timestamp, name; already_reacted,
// message_not_found). Updates and deletes of one channel are held to
// Slack's "about one message a second per channel": a second within a
// second of the last (on the fake's clock, SetClock) is answered 429 and
// counted in Overruns, so a test can tell berth kept to it.

// Edit is one chat.update or chat.delete the fake answered ok.
type Edit struct {
	Channel, TS string
	Text        string // "" for a delete
	Deleted     bool
	At          time.Time // on the fake's clock
}

// Reaction is one reactions.add the fake answered ok.
type Reaction struct {
	Channel, Timestamp, Name string
}

type progressState struct {
	now       func() time.Time
	edits     []Edit
	deleted   map[string]bool // channel NUL ts
	reactions []Reaction
	lastCall  map[string]time.Time // channel → last update or delete
	overruns  int
	// noReactionScope makes reactions.add answer missing_scope, as Slack
	// does for an app installed without reactions:write.
	noReactionScope  bool
	refusedReactions int
}

func (s *Server) handleProgress(mux *http.ServeMux) {
	s.progress = progressState{now: time.Now, deleted: map[string]bool{}, lastCall: map[string]time.Time{}}
	mux.HandleFunc("POST /api/chat.update", s.chatUpdate)
	mux.HandleFunc("POST /api/chat.delete", s.chatDelete)
	mux.HandleFunc("POST /api/reactions.add", s.reactionsAdd)
}

// SetClock makes the fake read time from now (a test's fake clock).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	s.progress.now = now
	s.mu.Unlock()
}

// Edits lists the updates and deletes, in order.
func (s *Server) Edits() []Edit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Edit(nil), s.progress.edits...)
}

// WithoutReactionsScope makes the fake an app installed without the
// reactions:write scope: reactions.add answers missing_scope with the
// needed and provided scopes, as api.slack.com documents.
func (s *Server) WithoutReactionsScope() {
	s.mu.Lock()
	s.progress.noReactionScope = true
	s.mu.Unlock()
}

// RefusedReactions counts reactions.add calls answered missing_scope.
func (s *Server) RefusedReactions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.refusedReactions
}

// WaitProgress waits until cond, given the posts, edits and reactions so
// far, holds, or ctx ends.
func (s *Server) WaitProgress(ctx context.Context, what string, cond func(posts []Post, edits []Edit, reactions []Reaction) bool) error {
	err := s.wait(ctx, func() bool { return cond(s.posts, s.progress.edits, s.progress.reactions) })
	if err != nil {
		return fmt.Errorf("waiting until %s: %w", what, err)
	}
	return nil
}

// Reactions lists the reactions added, in order.
func (s *Server) Reactions() []Reaction {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Reaction(nil), s.progress.reactions...)
}

// Overruns counts updates and deletes answered 429 for coming too fast.
func (s *Server) Overruns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress.overruns
}

// postedLocked tells whether ts is a message the bot posted in channel and
// did not delete.
func (s *Server) postedLocked(channel, ts string) bool {
	if s.progress.deleted[channel+"\x00"+ts] {
		return false
	}
	for _, p := range s.posts {
		if p.Channel == channel && p.TS == ts {
			return true
		}
	}
	return false
}

// tooFastLocked counts an update or delete of channel and tells whether it
// came within a second of the last.
func (s *Server) tooFastLocked(w http.ResponseWriter, channel string) bool {
	now := s.progress.now()
	if last, ok := s.progress.lastCall[channel]; ok && now.Sub(last) < time.Second {
		s.progress.overruns++
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"ok":false,"error":"ratelimited"}`))
		return true
	}
	s.progress.lastCall[channel] = now
	return false
}

func (s *Server) chatUpdate(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel, ts, text := r.PostForm.Get("channel"), r.PostForm.Get("ts"), r.PostForm.Get("text")
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case len([]rune(text)) > 40000:
		refuse(w, "msg_too_long")
		return
	case text == "":
		refuse(w, "no_text")
		return
	case s.tooFastLocked(w, channel):
		return
	case !s.postedLocked(channel, ts):
		refuse(w, "message_not_found")
		return
	}
	raw, hasBlocks := r.PostForm["blocks"]
	var blocks []Block
	if hasBlocks && len(raw) > 0 && raw[0] != "[]" {
		var bad string
		if blocks, bad = parseBlocks(raw[0]); bad != "" {
			refuse(w, bad)
			return
		}
	}
	s.progress.edits = append(s.progress.edits, Edit{Channel: channel, TS: ts, Text: text, At: s.progress.now()})
	for i := range s.posts {
		if s.posts[i].Channel == channel && s.posts[i].TS == ts {
			s.posts[i].Text = text
			if hasBlocks {
				s.posts[i].Blocks = blocks
			}
		}
	}
	s.notify()
	reply(w, map[string]any{"ok": true, "channel": channel, "ts": ts, "text": text})
}

func (s *Server) chatDelete(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel, ts := r.PostForm.Get("channel"), r.PostForm.Get("ts")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tooFastLocked(w, channel) {
		return
	}
	if !s.postedLocked(channel, ts) {
		refuse(w, "message_not_found")
		return
	}
	s.progress.deleted[channel+"\x00"+ts] = true
	s.progress.edits = append(s.progress.edits, Edit{Channel: channel, TS: ts, Deleted: true, At: s.progress.now()})
	s.notify()
	reply(w, map[string]any{"ok": true, "channel": channel, "ts": ts})
}

func (s *Server) reactionsAdd(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	rx := Reaction{Channel: r.PostForm.Get("channel"), Timestamp: r.PostForm.Get("timestamp"), Name: r.PostForm.Get("name")}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rx.Channel == "" || rx.Timestamp == "" || rx.Name == "" {
		refuse(w, "invalid_arguments")
		return
	}
	if s.progress.noReactionScope {
		s.progress.refusedReactions++
		s.notify()
		reply(w, map[string]any{"ok": false, "error": "missing_scope", "needed": "reactions:write", "provided": "chat:write,channels:history"})
		return
	}
	for _, old := range s.progress.reactions {
		if old == rx {
			refuse(w, "already_reacted")
			return
		}
	}
	s.progress.reactions = append(s.progress.reactions, rx)
	s.notify()
	reply(w, map[string]any{"ok": true})
}
