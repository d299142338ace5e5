package meepachat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

// maxShortWaits is how many short 429 waits one chunk may take inside Send
// before the reply goes back to intake's retry schedule.
const maxShortWaits = 3

// Send posts r in chunks of at most 4,000 characters, in order, in r's
// thread. Chunks already posted by an earlier call for the same reply are not
// posted again.
func (c *Connector) Send(ctx context.Context, r connector.Reply) error {
	err := c.send(ctx, r)
	if err != nil {
		c.status.Failed(fmt.Errorf("cannot post a reply: %w", err))
	} else {
		c.status.Healthy()
	}
	return err
}

func (c *Connector) send(ctx context.Context, r connector.Reply) error {
	path, err := c.replyPath(r)
	if err != nil {
		return err
	}
	files, notes := connector.FitFiles(r.Files, fileLimits)
	chunks := connector.Split(connector.WithNotes(r.Text, notes), maxContent)
	batches := fileBatches(files)
	if len(chunks) == 0 && len(batches) == 0 {
		c.log.Debug("empty meepachat reply; nothing to post", "run_id", r.RunID, "message_id", r.MessageID)
		return nil
	}
	key := r.RunID + "\x00" + r.MessageID
	c.mu.Lock()
	p := c.progress[key]
	c.mu.Unlock()
	start := 0
	if p.text == r.Text {
		start = min(p.sent, len(chunks)+len(batches))
	}
	// The chunks, then one message per batch of files; sent counts both.
	for i := start; i < len(chunks)+len(batches); i++ {
		var err error
		if i < len(chunks) {
			err = c.postChunk(ctx, path, chunks[i], r.Thread, nil)
		} else {
			err = c.postFiles(ctx, path, r.Thread, batches[i-len(chunks)])
		}
		if err != nil {
			c.mu.Lock()
			if connector.IsPermanent(err) {
				delete(c.progress, key)
			} else {
				c.progress[key] = sendProgress{text: r.Text, sent: i}
			}
			c.mu.Unlock()
			return fmt.Errorf("cannot post part %d of %d: %w", i+1, len(chunks)+len(batches), err)
		}
	}
	c.mu.Lock()
	delete(c.progress, key)
	c.mu.Unlock()
	c.log.Debug("meepachat reply posted", "run_id", r.RunID, "message_id", r.MessageID, "chunks", len(chunks)-start)
	return nil
}

// replyPath is the REST path for r's channel: a DM or a server channel.
func (c *Connector) replyPath(r connector.Reply) (string, error) {
	if r.Channel == "" {
		return "", &connector.PermanentError{Reason: "the reply names no MeepaChat channel"}
	}
	ch := url.PathEscape(r.Channel)
	if r.Meta[MetaDM] == "true" {
		return "/api/dms/" + ch + "/messages", nil
	}
	server := r.Meta[MetaServer]
	if server == "" {
		c.mu.Lock()
		info, known := c.channels[r.Channel]
		ready := c.bot.ID != ""
		c.mu.Unlock()
		switch {
		case known && info.dm:
			return "/api/dms/" + ch + "/messages", nil
		case known && info.server != "":
			server = info.server
		case ready:
			return "", &connector.PermanentError{Reason: fmt.Sprintf("channel %s is in none of the bot's MeepaChat servers", r.Channel)}
		default:
			return "", errors.New("the MeepaChat server of the channel is not known until the gateway is ready")
		}
	}
	return "/api/servers/" + url.PathEscape(server) + "/channels/" + ch + "/messages", nil
}

// postChunk posts one chunk, waiting out short rate limits.
func (c *Connector) postChunk(ctx context.Context, path, content, thread string, attachments []string) error {
	body, err := json.Marshal(struct {
		Content       string   `json:"content"`
		ThreadID      string   `json:"threadId,omitempty"`
		AttachmentIDs []string `json:"attachmentIds,omitempty"`
	}{content, thread, attachments})
	if err != nil {
		return fmt.Errorf("cannot encode the reply: %w", err)
	}
	for waits := 0; ; waits++ {
		status, header, apiErr, err := c.post(ctx, path, body)
		if err != nil {
			return err
		}
		switch {
		case status >= 200 && status < 300:
			if apiErr != "" {
				return fmt.Errorf("meepachat answered HTTP %d with an error: %s", status, apiErr)
			}
			return nil
		case status == http.StatusTooManyRequests:
			wait := retryAfter(header.Get("Retry-After"), c.clock.Now())
			limited := fmt.Errorf("meepachat rate limit (HTTP 429): %s", orDefault(apiErr, "too many requests"))
			if wait > c.o.MaxRetryWait || waits >= maxShortWaits {
				return &connector.RetryAfterError{After: wait, Err: limited}
			}
			c.log.Debug("meepachat rate limit; waiting", "wait", wait.String())
			select {
			case <-ctx.Done():
				return fmt.Errorf("gave up waiting out a rate limit: %w", ctx.Err())
			case <-c.clock.After(wait):
			}
		case status == http.StatusUnauthorized:
			c.status.Warn("MeepaChat refused the bot token when posting a reply (HTTP 401): check the token")
			return fmt.Errorf("meepachat refused the bot token (HTTP 401)")
		case status == http.StatusBadRequest || status == http.StatusForbidden || status == http.StatusNotFound ||
			status == http.StatusGone || status == http.StatusRequestEntityTooLarge || status == http.StatusUnprocessableEntity:
			return &connector.PermanentError{Reason: fmt.Sprintf("meepachat refused the reply (HTTP %d): %s", status, orDefault(apiErr, http.StatusText(status)))}
		default:
			return fmt.Errorf("meepachat answered HTTP %d: %s", status, orDefault(apiErr, http.StatusText(status)))
		}
	}
}

// post sends one request and returns the status, headers and the error
// field of the {data, error} answer.
func (c *Connector) post(ctx context.Context, path string, body []byte) (int, http.Header, string, error) {
	status, header, apiErr, _, err := c.request(ctx, http.MethodPost, path, body, "application/json")
	return status, header, apiErr, err
}

// request sends one request and returns the status, headers, the error
// field and the data field of the {data, error} answer.
func (c *Connector) request(ctx context.Context, method, path string, body []byte, contentType string) (int, http.Header, string, json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, "", nil, fmt.Errorf("cannot build the request: %w", err)
	}
	req.Header.Set("Authorization", "Bot "+c.o.Token)
	req.Header.Set("Content-Type", contentType)
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, "", nil, fmt.Errorf("cannot post to meepachat: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var env struct {
		Data  json.RawMessage `json:"data"`
		Error json.RawMessage `json:"error"`
	}
	apiErr := ""
	if json.Unmarshal(raw, &env) == nil && len(env.Error) > 0 && string(env.Error) != "null" {
		var s string
		if json.Unmarshal(env.Error, &s) == nil {
			apiErr = s
		} else {
			apiErr = string(env.Error)
		}
	}
	return resp.StatusCode, resp.Header, truncate(strings.TrimSpace(apiErr), 200), env.Data, nil
}

// retryAfter reads Retry-After as seconds or an HTTP date; missing or bad
// values mean one second.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Second
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return time.Second
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
