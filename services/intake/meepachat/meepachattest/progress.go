package meepachattest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
)

// Reactions as MeepaChat's published bot client makes them
// (openclaw/src/http-client.ts, addReaction): PUT
// {base}/api/messages/{messageId}/reactions/{emoji}, the emoji URL-escaped,
// answered 204. The bot API has no message edit, so there is no progress
// message on MeepaChat.

// Reaction is one reaction a bot added.
type Reaction struct {
	MessageID, Emoji string
}

func (f *Fake) handleReactions(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/messages/{message}/reactions/{emoji}", f.addReaction)
}

// Reactions lists the reactions added, in order.
func (f *Fake) Reactions() []Reaction {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reactions)
}

// WaitReactions waits until n reactions were added.
func (f *Fake) WaitReactions(ctx context.Context, n int) ([]Reaction, error) {
	err := f.wait(ctx, fmt.Sprintf("%d reactions", n), func() bool { return len(f.reactions) >= n })
	return f.Reactions(), err
}

func (f *Fake) addReaction(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	f.reactions = append(f.reactions, Reaction{MessageID: r.PathValue("message"), Emoji: r.PathValue("emoji")})
	f.notifyLocked()
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
