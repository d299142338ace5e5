package intake

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/services/intake/connector"
)

const (
	// MaxBodyBytes is the largest webhook body accepted.
	MaxBodyBytes = 1 << 20
	// MaxIDLength is the longest message id accepted.
	MaxIDLength = 200

	connectorTypeWebhook = "webhook"
)

// webhookMessage is the body of POST /hooks/{connector}.
type webhookMessage struct {
	ID          string `json:"id"`
	Channel     string `json:"channel"`
	ChannelName string `json:"channel_name"`
	Thread      string `json:"thread"`
	Author      string `json:"author"`
	Text        string `json:"text"`
	// Files are the message's attachments, each by url (intake downloads
	// it) or inline as base64.
	Files []webhookFile `json:"files,omitempty"`

	inlineBytes int64 // the length of the files' base64 in the body
}

// webhookFile is one attachment of a webhook message.
type webhookFile struct {
	Name   string `json:"name"`
	Type   string `json:"type,omitempty"`
	URL    string `json:"url,omitempty"`
	Base64 string `json:"base64,omitempty"`

	data []byte // Base64 decoded
}

// maxHookBody is the largest webhook body taken: MaxBodyBytes for the
// message, and room for its files in base64 up to [intake]
// max_message_attachment_bytes.
func maxHookBody(limit int64) int64 {
	return MaxBodyBytes + (limit+2)/3*4
}

// Handler serves /hooks/{connector} and GET /healthz. A webhook connector
// takes signed POSTs (serveHook); a connector that receives over HTTP
// (connector.HTTPReceiver: Discord interactions, Slack's Events API) gets
// every request under its path.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/hooks/{connector}", s.serveConnector)
	mux.HandleFunc("/hooks/{connector}/{rest...}", s.serveConnector)
	mux.HandleFunc("GET /healthz", s.serveHealth)
	return mux
}

// serveHealth answers GET /healthz: 200 while intake runs. While its state
// disk is full (the last commit was refused for want of space) the body says
// so, with the directory and the space free now; it says ok again after the
// next commit that succeeds.
func (s *Service) serveHealth(w http.ResponseWriter, _ *http.Request) {
	full := s.store.w.DiskFull()
	if full == nil {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	free, _ := boltstore.FreeBytes(full.Dir)
	writeJSON(w, http.StatusOK, map[string]string{
		"status":     "state disk full",
		"state_dir":  full.Dir,
		"free_bytes": strconv.FormatUint(free, 10),
	})
}

func (s *Service) serveConnector(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("connector")
	rc, ok := s.connectorByID(id)
	if ok && rc.handler != nil {
		rc.handler.ServeHTTP(w, r)
		return
	}
	if !ok || rc.cfg.Type != connectorTypeWebhook || r.PathValue("rest") != "" {
		s.log.Info("request for unknown connector refused", "connector", id)
		s.countRefused(id, refusedUnknownConnector)
		writeError(w, http.StatusNotFound, "no webhook connector named "+id)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "webhooks are POSTed")
		return
	}
	s.serveHook(w, r)
}

func (s *Service) serveHook(w http.ResponseWriter, r *http.Request) {
	connectorID := r.PathValue("connector")
	log := s.log.With("connector", connectorID)
	w, ctx, endSpan := traceReceive(w, r, connectorID)
	defer endSpan()

	maxBody := maxHookBody(s.config().IntakeSettings().MessageAttachmentLimit())
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.countRefused(connectorID, refusedTooLarge)
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is larger than %d bytes", maxBody))
			return
		}
		s.countRefused(connectorID, refusedUnreadable)
		writeError(w, http.StatusBadRequest, "cannot read body")
		return
	}

	cfg := s.config()
	conn, ok := cfg.Connector(connectorID)
	if !ok || conn.Type != connectorTypeWebhook {
		log.Info("webhook for unknown connector refused")
		s.countRefused(connectorID, refusedUnknownConnector)
		writeError(w, http.StatusNotFound, "no webhook connector named "+connectorID)
		return
	}
	secret, err := cfg.ConnectorSecret(connectorID)
	if err != nil || len(secret) == 0 {
		log.Error("connector has no usable secret; refusing its webhooks", "err", err)
		s.countRefused(connectorID, refusedMisconfigured)
		writeError(w, http.StatusInternalServerError, "connector is misconfigured")
		return
	}
	if err := verifySignature(r.Header, secret, s.clock.Now(), body); err != nil {
		log.Info("webhook refused", "reason", err)
		s.countRefused(connectorID, refusedSignature)
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}

	in, err := decodeWebhookMessage(body)
	if err == nil && int64(len(body))-in.inlineBytes > MaxBodyBytes {
		// Only the files' base64 may take a body past MaxBodyBytes.
		s.countRefused(connectorID, refusedTooLarge)
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the message without its files is larger than %d bytes", MaxBodyBytes))
		return
	}
	if err != nil {
		s.countRefused(connectorID, refusedMalformed)
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if in.ID == "" {
		// Derived from the signed request, not random: a replay of the same
		// signed request within the timestamp window maps to the same id
		// and runs nothing again.
		in.ID = derivedMessageID(connectorID, r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature))
	}
	log = log.With("message_id", in.ID)

	// A repeat is acknowledged even if the routes have changed since.
	if prior, found, err := s.store.message(connectorID, in.ID); err != nil {
		log.Error("cannot look up message", "err", err)
		writeError(w, http.StatusInternalServerError, "cannot store message")
		return
	} else if found {
		log.Info("duplicate message acknowledged", "agent", prior.Agent)
		s.countDuplicate(connectorID)
		writeJSON(w, http.StatusAccepted, map[string]string{"id": in.ID})
		return
	}

	agent, err := cfg.RouteMessage(connectorID, in.Channel, in.ChannelName, "")
	if err == nil && agent == "" {
		err = fmt.Errorf("no agent for channel %q", in.Channel)
	}
	if err != nil {
		log.Info("message has no route", "channel", in.Channel, "err", err)
		s.countRefused(connectorID, refusedNoRoute)
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	log = log.With("agent", agent)

	m := inboxEntry{
		Connector:   connectorID,
		ID:          in.ID,
		Channel:     in.Channel,
		ChannelName: in.ChannelName,
		Thread:      in.Thread,
		Author:      in.Author,
		// The signed body names its author: a webhook's approver is
		// "webhook:<author>".
		AuthorID:   in.Author,
		Text:       in.Text,
		Agent:      agent,
		ReceivedAt: s.clock.Now().UTC(),
		Decision:   decisionOf(connector.Message{Text: in.Text}),
	}
	var hookConn connector.Connector
	if rc, ok := s.connectorByID(connectorID); ok {
		hookConn = rc.conn
		if wc, ok := rc.conn.(*webhookConnector); ok {
			wc.noteEvent(s.clock.Now())
		}
	}
	if len(in.Files) > 0 && m.Decision == nil {
		atts := make([]connector.Attachment, len(in.Files))
		for i, f := range in.Files {
			atts[i] = connector.Attachment{Name: f.Name, Type: f.Type, URL: f.URL, Data: f.data}
		}
		if m.Files, m.Refusal, err = s.takeAttachments(r.Context(), hookConn, m.Key(), atts); err != nil {
			log.Warn("message's files could not be downloaded; nothing stored", "err", err)
			w.Header().Set("Retry-After", strconv.Itoa(int(storeRetryAfter/time.Second)))
			writeError(w, http.StatusServiceUnavailable, "cannot take the message's files; nothing was stored, retry later: "+err.Error())
			return
		}
	}
	if err := s.keepTraced(ctx, func(m inboxEntry) error { return s.keep(log, m) }, m); err != nil {
		s.refuseUnstored(w, log, connectorID, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": in.ID})
}

// storeRetryAfter is the Retry-After of a message refused because intake.db
// could not store it.
const storeRetryAfter = 30 * time.Second

// refuseUnstored answers a message that could not be stored: 503 with a
// Retry-After, since nothing was kept and the same POST will be taken once
// the store can write again. A full disk is logged by the store's committer
// (once a minute, naming the state directory and its free space), so a
// storm of refused POSTs does not become a storm of log lines.
func (s *Service) refuseUnstored(w http.ResponseWriter, log *slog.Logger, connectorID string, err error) {
	w.Header().Set("Retry-After", strconv.Itoa(int(storeRetryAfter/time.Second)))
	if boltstore.IsDiskFull(err) {
		s.countRefused(connectorID, refusedDiskFull)
		log.Debug("message refused: the state disk is full", "err", err)
		writeError(w, http.StatusServiceUnavailable, "intake's state disk is full; nothing was stored, retry later")
		return
	}
	log.Error("cannot accept message", "err", err)
	s.countRefused(connectorID, refusedStore)
	writeError(w, http.StatusServiceUnavailable, "cannot store message; nothing was stored, retry later")
}

func decodeWebhookMessage(body []byte) (webhookMessage, error) {
	var in webhookMessage
	if !utf8.Valid(body) {
		return in, invalidUTF8Field(body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("malformed JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return in, errors.New("malformed JSON: data after the object")
	}
	for _, f := range []struct{ name, value string }{
		{"id", in.ID}, {"channel", in.Channel}, {"channel_name", in.ChannelName},
		{"thread", in.Thread}, {"author", in.Author}, {"text", in.Text},
	} {
		// D-Bus strings cannot carry NUL: such a message could never be
		// handed to the scheduler.
		if err := checkText(f.name, f.value); err != nil {
			return in, err
		}
	}
	for _, f := range []struct{ name, value string }{
		{"channel", in.Channel}, {"author", in.Author}, {"text", in.Text},
	} {
		if f.value == "" {
			return in, fmt.Errorf("missing %s", f.name)
		}
	}
	if in.ID != "" {
		if err := validID(in.ID); err != nil {
			return in, fmt.Errorf("bad id: %v", err)
		}
	}
	if len(in.Files) > busapi.MaxFiles {
		return in, fmt.Errorf("%d files: at most %d per message", len(in.Files), busapi.MaxFiles)
	}
	for i := range in.Files {
		f := &in.Files[i]
		if err := checkText(fmt.Sprintf("files[%d].name", i), f.Name); err != nil {
			return in, err
		}
		switch {
		case (f.URL == "") == (f.Base64 == ""):
			return in, fmt.Errorf("files[%d]: give url or base64, one of them", i)
		case f.URL != "":
			u, err := url.Parse(f.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return in, fmt.Errorf("files[%d].url %q: want an http or https URL", i, f.URL)
			}
		default:
			data, err := base64.StdEncoding.DecodeString(f.Base64)
			if err != nil {
				return in, fmt.Errorf("files[%d].base64: %v", i, err)
			}
			in.inlineBytes += int64(len(f.Base64))
			f.data, f.Base64 = data, ""
		}
	}
	return in, nil
}

// invalidUTF8Field names the field of a JSON object body whose raw bytes are
// not valid UTF-8 (encoding/json would silently replace them).
func invalidUTF8Field(body []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err == nil {
		names := slices.Sorted(maps.Keys(raw))
		for _, name := range names {
			if !utf8.Valid(raw[name]) {
				return fmt.Errorf("%s is not valid UTF-8", name)
			}
		}
	}
	return errors.New("body is not valid UTF-8")
}

// validID accepts up to MaxIDLength visible ASCII characters other than "/":
// ids become database keys and the second half of "<connector>/<id>".
func validID(id string) error {
	if id == "" {
		return errors.New("empty")
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("longer than %d characters", MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' || c == '/' {
			return fmt.Errorf("character %q at %d is not printable ASCII other than space and /", c, i)
		}
	}
	return nil
}

// derivedMessageID names a message that came without an id after its
// signature, which is unique per (secret, timestamp, body).
func derivedMessageID(connector, timestamp, signature string) string {
	sum := sha256.Sum256([]byte(connector + "\x00" + timestamp + "\x00" + signature))
	return "sig-" + base64.RawURLEncoding.EncodeToString(sum[:18])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
