package slack

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

// signatureWindow is how far X-Slack-Request-Timestamp may be from the
// clock: Slack's advice against replays.
const signatureWindow = 5 * time.Minute

// badSignatureWarning is how many rejected requests in a row make a
// standing warning (a wrong signing_secret fails every request).
const badSignatureWarning = 3

// badSignatureWarningText is that warning.
const badSignatureWarningText = "Events API requests keep failing signature verification: check signing_secret (Basic Information → Signing Secret)"

// Handler serves the Events API (events mode) at /hooks/{connector id}.
func (c *Connector) Handler(sink connector.Sink) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.serveEvents(w, r, sink)
	})
}

func (c *Connector) serveEvents(w http.ResponseWriter, r *http.Request, sink connector.Sink) {
	if c.o.Mode != ModeEvents {
		http.Error(w, "this Slack connector uses Socket Mode", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.o.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			c.log.Warn("rejected a Slack request: body too large", "limit", c.o.MaxBodyBytes)
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		c.log.Warn("cannot read a Slack request", "error", err)
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	if err := c.verify(r.Header, body); err != nil {
		c.log.Warn("rejected a Slack request", "error", err, "remote", r.RemoteAddr)
		c.status.Failed(fmt.Errorf("rejected a request: %w", err))
		c.mu.Lock()
		c.badSignatures++
		warn := c.badSignatures >= badSignatureWarning
		c.mu.Unlock()
		if warn {
			c.status.Warn(badSignatureWarningText)
		}
		http.Error(w, "invalid signature", http.StatusUnauthorized)
		return
	}
	c.mu.Lock()
	c.badSignatures = 0
	c.mu.Unlock()
	c.status.ClearWarning(badSignatureWarningText)
	if form, ok := interactionForm(r.Header, body); ok {
		c.serveInteraction(w, r, sink, form)
		return
	}
	var cb callback
	if err := json.Unmarshal(body, &cb); err != nil {
		c.log.Warn("ignored a Slack request that is not JSON", "error", err)
		http.Error(w, "malformed JSON", http.StatusBadRequest)
		return
	}
	if retry := r.Header.Get("X-Slack-Retry-Num"); retry != "" {
		c.log.Debug("Slack retries an event", "retry", retry, "reason", r.Header.Get("X-Slack-Retry-Reason"), "event_id", cb.EventID)
	}
	switch cb.Type {
	case "url_verification":
		c.sawEvent()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, cb.Challenge)
		return
	case "app_rate_limited":
		c.sawEvent()
		c.log.Warn("Slack is dropping events: the app exceeded 30,000 events per hour")
		c.status.Failed(errors.New("Slack rate-limited the app's events (app_rate_limited)"))
		w.WriteHeader(http.StatusOK)
		return
	}
	err = c.deliver(r.Context(), sink, cb, "events")
	switch {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, errBadPayload):
		c.log.Warn("ignored a malformed Slack event", "error", c.errText(err))
		http.Error(w, "malformed event", http.StatusBadRequest)
	default:
		c.status.Failed(errors.New(c.errText(err)))
		http.Error(w, "not stored, retry later", http.StatusInternalServerError)
	}
}

// verify checks Slack's v0 request signature and its timestamp window.
func (c *Connector) verify(h http.Header, body []byte) error {
	sig, ts := h.Get("X-Slack-Signature"), h.Get("X-Slack-Request-Timestamp")
	if sig == "" || ts == "" {
		return errors.New("X-Slack-Signature or X-Slack-Request-Timestamp is missing")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("X-Slack-Request-Timestamp is not a Unix time")
	}
	if d := c.clock.Now().Sub(time.Unix(secs, 0)); d > signatureWindow || d < -signatureWindow {
		return fmt.Errorf("X-Slack-Request-Timestamp is %s away from now (at most %s)", d.Round(time.Second), signatureWindow)
	}
	hexSig, ok := strings.CutPrefix(sig, "v0=")
	if !ok {
		return errors.New("X-Slack-Signature is not a v0 signature")
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return errors.New("X-Slack-Signature is not a hex SHA-256")
	}
	mac := hmac.New(sha256.New, []byte(c.o.SigningSecret))
	fmt.Fprintf(mac, "v0:%s:", ts)
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), got) {
		return errors.New("X-Slack-Signature does not match the body")
	}
	return nil
}

// interactionForm is the payload of an interactivity request (a form
// POST of payload=JSON, signed like events); ok is false for an event.
func interactionForm(h http.Header, body []byte) ([]byte, bool) {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "application/x-www-form-urlencoded" {
		return nil, false
	}
	v, err := url.ParseQuery(string(body))
	if err != nil || v.Get("payload") == "" {
		return nil, false
	}
	return []byte(v.Get("payload")), true
}

// serveInteraction answers an interactivity request: 200 once the click
// is stored (Slack shows the user an error for anything else within 3 s).
func (c *Connector) serveInteraction(w http.ResponseWriter, r *http.Request, sink connector.Sink, payload []byte) {
	err := c.interaction(r.Context(), sink, payload, "events")
	switch {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, errBadPayload):
		c.log.Warn("ignored a malformed Slack interaction", "error", c.errText(err))
		http.Error(w, "malformed interaction", http.StatusBadRequest)
	default:
		c.status.Failed(errors.New(c.errText(err)))
		http.Error(w, "not stored, retry", http.StatusInternalServerError)
	}
}
