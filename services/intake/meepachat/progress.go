package meepachat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Reactions (docs/adr/0027-live-progress.md): PUT
// {base}/api/messages/{messageId}/reactions/{emoji} with the bot's
// Authorization header, as MeepaChat's published bot client adds them. Its
// bot API has no message edit, so MeepaChat shows progress as typing only.

var reactionEmoji = map[string]string{
	connector.ReactionAccepted:  "👀",
	connector.ReactionSucceeded: "✅",
	connector.ReactionFailed:    "❌",
}

// React implements connector.Reactor.
func (c *Connector) React(ctx context.Context, r connector.Reaction) error {
	emoji, ok := reactionEmoji[r.Status]
	if !ok {
		return errors.New("unknown reaction status " + r.Status)
	}
	if r.MessageID == "" {
		return &connector.PermanentError{Reason: "the reaction names no MeepaChat message"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	path := "/api/messages/" + url.PathEscape(r.MessageID) + "/reactions/" + url.PathEscape(emoji)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("cannot build the request: %w", err)
	}
	req.Header.Set("Authorization", "Bot "+c.o.Token)
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot react on meepachat: %w", err)
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusNotFound:
		return &connector.PermanentError{Reason: fmt.Sprintf("meepachat refused the reaction (HTTP %d)", resp.StatusCode)}
	}
	return fmt.Errorf("meepachat answered HTTP %d to a reaction", resp.StatusCode)
}
