package discord

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
)

// rateLimits keeps Discord's answers about when the next request may go:
// per route (X-RateLimit-Remaining / Reset-After) and global (a 429 with the
// global flag).
type rateLimits struct {
	clock  clockwork.Clock
	mu     sync.Mutex
	global time.Time
	routes map[string]time.Time // route → not before, when its bucket is empty
}

func newRateLimits(clock clockwork.Clock) *rateLimits {
	return &rateLimits{clock: clock, routes: map[string]time.Time{}}
}

// wait is how long a request on route must wait.
func (r *rateLimits) wait(route string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	until := r.global
	if t := r.routes[route]; t.After(until) {
		until = t
	}
	if until.After(now) {
		return until.Sub(now)
	}
	return 0
}

func (r *rateLimits) block(route string, d time.Duration, global bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	until := r.clock.Now().Add(d)
	if global {
		if until.After(r.global) {
			r.global = until
		}
		return
	}
	if until.After(r.routes[route]) {
		r.routes[route] = until
	}
}

// update reads a response's bucket headers (rate-limits.mdx).
func (r *rateLimits) update(route string, h http.Header) {
	remaining, err1 := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
	after, err2 := seconds(h.Get("X-RateLimit-Reset-After"))
	if err1 != nil || err2 != nil {
		return
	}
	if remaining > 0 {
		r.mu.Lock()
		delete(r.routes, route)
		r.mu.Unlock()
		return
	}
	r.block(route, after, false)
}

func seconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 86400 {
		return 0, errors.New("not a number of seconds")
	}
	return time.Duration(f * float64(time.Second)), nil
}

// apiError is Discord's JSON error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// safeError is an error whose text was stripped of credentials; it unwraps
// to the cause without the request URL.
type safeError struct {
	msg string
	err error
}

func (e *safeError) Error() string { return e.msg }
func (e *safeError) Unwrap() error { return e.err }

const maxRateLimitRetries = 5

// call sends one REST request, waiting out short rate limits. route keys
// the rate-limit bucket and names the request in errors and logs; it never
// holds a credential. secrets are redacted from errors.
func (c *Connector) call(ctx context.Context, method, route, path string, body any, auth bool, secrets ...string) ([]byte, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("cannot encode the request: %w", err)
		}
	}
	return c.callBody(ctx, method, route, path, payload, "application/json", auth, secrets...)
}

// callBody is call with a body already encoded as contentType (a
// multipart form for uploads).
func (c *Connector) callBody(ctx context.Context, method, route, path string, payload []byte, contentType string, auth bool, secrets ...string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		if w := c.limits.wait(route); w > 0 {
			if w > c.o.MaxInlineWait {
				return nil, &connector.RetryAfterError{After: w, Err: fmt.Errorf("discord rate limit on %s", route)}
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-c.clock.After(w):
			}
		}
		status, header, data, err := c.do(ctx, method, path, payload, contentType, auth, secrets)
		if err != nil {
			return nil, err
		}
		c.limits.update(route, header)
		switch {
		case status >= 200 && status < 300:
			return data, nil
		case status == http.StatusTooManyRequests:
			after, global := retryAfter(header, data)
			c.limits.block(route, after, global)
			c.log.Info("discord rate limit", "route", route, "retry_after", after.String(), "global", global)
			if after <= c.o.MaxInlineWait && attempt < maxRateLimitRetries {
				continue
			}
			return nil, &connector.RetryAfterError{After: after, Err: fmt.Errorf("discord answered 429 on %s", route)}
		case status >= 500:
			return nil, fmt.Errorf("discord answered %d on %s", status, route)
		default:
			return nil, &connector.PermanentError{Reason: "discord refused " + route + ": " + c.redact(describe(status, data), secrets...)}
		}
	}
}

func (c *Connector) do(ctx context.Context, method, path string, payload []byte, contentType string, auth bool, secrets []string) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.apiBase+path, body)
	if err != nil {
		return 0, nil, nil, &safeError{msg: "cannot build the request"}
	}
	if payload != nil {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("User-Agent", "DiscordBot (https://github.com/berth-dev/berth, 1)")
	if auth && c.o.BotToken != "" {
		req.Header.Set("Authorization", "Bot "+c.o.BotToken)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cause := err
		var ue *url.Error
		if errors.As(err, &ue) {
			cause = ue.Err
		}
		return 0, nil, nil, &safeError{msg: "cannot reach discord: " + c.redact(cause.Error(), secrets...), err: cause}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, &safeError{msg: "cannot read discord's answer: " + c.redact(err.Error(), secrets...)}
	}
	return resp.StatusCode, resp.Header, data, nil
}

// retryAfter reads a 429: Retry-After (header) or retry_after (body), and
// the global flag from X-RateLimit-Global or the body.
func retryAfter(h http.Header, body []byte) (time.Duration, bool) {
	var b struct {
		RetryAfter float64 `json:"retry_after"`
		Global     bool    `json:"global"`
	}
	_ = json.Unmarshal(body, &b)
	global := b.Global || h.Get("X-RateLimit-Global") == "true"
	after, err := seconds(h.Get("Retry-After"))
	if err != nil {
		after, err = seconds(strconv.FormatFloat(b.RetryAfter, 'f', -1, 64))
	}
	if err != nil || after <= 0 {
		after = time.Second
	}
	return after, global
}

func describe(status int, data []byte) string {
	var e apiError
	text := http.StatusText(status)
	if json.Unmarshal(data, &e) == nil && e.Message != "" {
		return fmt.Sprintf("%d %s: %s (code %d)", status, text, e.Message, e.Code)
	}
	return fmt.Sprintf("%d %s", status, text)
}

// Send posts r in chunks of at most 2,000 characters, in order: into the
// thread (or channel) as a reply to the message, or, for a slash command, as
// follow-up messages of its interaction.
func (c *Connector) Send(ctx context.Context, r connector.Reply) error {
	text := r.Text
	if text == "" {
		text = "(no reply)"
	}
	files, notes := connector.FitFiles(r.Files, fileLimits)
	chunks := connector.Split(connector.WithNotes(text, notes), MessageLimit)
	batches := fileBatches(files)
	key := r.RunID + "\x00" + r.MessageID
	c.mu.Lock()
	done := c.progress[key]
	c.mu.Unlock()
	token := r.Meta[MetaInteractionToken]
	target := r.Thread
	if target == "" {
		target = r.Channel
	}
	if token == "" && target == "" {
		return &connector.PermanentError{Reason: "the reply names no Discord channel"}
	}
	if token == "" && c.decideQuestion(ctx, r) {
		return nil
	}
	// A question's buttons go below its last chunk of text.
	buttons := c.questionComponents(r.Question)
	// The chunks, then one message per batch of files; done counts both.
	for i := done; i < len(chunks)+len(batches); i++ {
		var rows []actionRow
		if i == len(chunks)-1 {
			rows = buttons
		}
		var err error
		switch {
		case i >= len(chunks):
			err = c.postFiles(ctx, target, r.Meta[MetaApplicationID], token, r.MessageID, batches[i-len(chunks)], replyNonce(r.RunID, i))
		case token != "":
			err = c.postFollowup(ctx, r.Meta[MetaApplicationID], token, r.MessageID, chunks[i], rows)
		default:
			ref := ""
			if i == 0 {
				ref = replyReference(r)
			}
			err = c.postMessage(ctx, target, chunks[i], ref, replyNonce(r.RunID, i), rows)
		}
		c.mu.Lock()
		if err == nil {
			c.progress[key] = i + 1
		} else if connector.IsPermanent(err) {
			delete(c.progress, key)
		}
		c.mu.Unlock()
		if err != nil {
			c.log.Warn("cannot post the discord reply", "run_id", r.RunID, "message_id", r.MessageID, "part", i+1, "chunks", len(chunks), "file_messages", len(batches), "error", err)
			err = fmt.Errorf("cannot post part %d of %d: %w", i+1, len(chunks)+len(batches), err)
			c.status.Failed(err)
			return err
		}
	}
	c.status.Healthy()
	c.mu.Lock()
	delete(c.progress, key)
	c.mu.Unlock()
	c.log.Debug("discord reply posted", "run_id", r.RunID, "message_id", r.MessageID, "chunks", len(chunks))
	return nil
}

// noMentions keeps an agent's text from pinging anyone.
var noMentions = map[string]any{"parse": []string{}}

// nonceLimit is the longest nonce Discord takes (resources/message.mdx).
const nonceLimit = 25

// replyNonce is the nonce of chunk i of a run's reply: the run id, with
// ".<n>" for the chunks after the first, hashed to nonceLimit characters
// when longer (a scheduler run id has 36). Posted with enforce_nonce, a
// chunk posted again after a crash or a lost answer returns the message
// already made instead of a second one.
func replyNonce(runID string, chunk int) string {
	if runID == "" {
		return ""
	}
	n := runID
	if chunk > 0 {
		n += "." + strconv.Itoa(chunk+1)
	}
	if len(n) <= nonceLimit {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return hex.EncodeToString(sum[:])[:nonceLimit]
}

// replyReference is the message a reply answers on Discord: the message
// itself, or for a click (which is no message) the question it clicked on.
func replyReference(r connector.Reply) string {
	if strings.HasPrefix(r.MessageID, interactionIDPrefix) {
		return r.Meta[MetaReplyTo]
	}
	return r.MessageID
}

func (c *Connector) postMessage(ctx context.Context, channel, content, replyTo, nonce string, rows []actionRow) error {
	body := map[string]any{"content": content, "allowed_mentions": noMentions}
	if len(rows) > 0 {
		body["components"] = rows
	}
	if nonce != "" {
		// Discord keeps a nonce for a few minutes: a retry after longer than
		// that posts again.
		body["nonce"], body["enforce_nonce"] = nonce, true
	}
	if replyTo != "" {
		body["message_reference"] = map[string]any{"message_id": replyTo, "fail_if_not_exists": false}
	}
	route := "POST /channels/" + channel + "/messages"
	_, err := c.call(ctx, http.MethodPost, route, "/channels/"+url.PathEscape(channel)+"/messages", body, true)
	return err
}

func (c *Connector) postFollowup(ctx context.Context, app, token, interactionID, content string, rows []actionRow) error {
	if app == "" {
		app = c.o.ApplicationID
	}
	if app == "" {
		return &connector.PermanentError{Reason: "the interaction reply has no application id"}
	}
	// The route names the interaction, never its token.
	route := "POST /webhooks/" + app + "/(interaction " + interactionID + ")"
	path := "/webhooks/" + url.PathEscape(app) + "/" + url.PathEscape(token)
	body := map[string]any{"content": content, "allowed_mentions": noMentions}
	if len(rows) > 0 {
		body["components"] = rows
	}
	_, err := c.call(ctx, http.MethodPost, route, path, body, false, token)
	return err
}

// Typing shows "typing…" in the message's channel (thread) for a run in
// progress; a slash command shows "thinking…" by itself.
func (c *Connector) Typing(ctx context.Context, channel string, meta map[string]string) error {
	if c.o.BotToken == "" || meta[MetaInteractionToken] != "" {
		return nil
	}
	if ch := meta[MetaReplyChannel]; ch != "" {
		channel = ch
	}
	if channel == "" {
		return nil
	}
	_, err := c.call(ctx, http.MethodPost, "POST /channels/"+channel+"/typing", "/channels/"+url.PathEscape(channel)+"/typing", nil, true)
	return err
}
