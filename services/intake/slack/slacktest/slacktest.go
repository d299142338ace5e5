// Package slacktest is an in-process fake of Slack for tests: the Web API
// methods berth calls (apps.connections.open, auth.test, chat.postMessage,
// conversations.info, conversations.history, conversations.replies, the
// files upload v2 flow of files.go)
// and a Socket Mode WebSocket, speaking Slack's documented wire protocol
// (hello, events_api envelopes with envelope_id / retry_attempt /
// retry_reason, disconnect, WebSocket pings, acknowledgements), plus
// helpers that sign Events API requests as Slack does (v0 HMAC-SHA256).
//
// A test drives it: Deliver sends an event in an envelope on the open
// socket, Redeliver sends an unacknowledged one again as Slack's retry does,
// SetSilent stops its pings, Drop cuts the socket without a close frame,
// Disconnect sends Slack's disconnect frame, RateLimit and Refuse shape chat.postMessage answers.
// chat.postMessage keeps message metadata, and conversations.history and
// conversations.replies return the history with it (include_all_metadata),
// paged with limit and cursor; HoldPosts and HoldHandshakes hold answers
// so that a test can crash or refresh at that point.
package slacktest

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Options describe the fake workspace. Zero fields get test defaults.
type Options struct {
	AppToken  string // default "xapp-1-test"
	BotToken  string // default "xoxb-test"
	TeamID    string // default "T0TEST"
	BotUserID string // default "U0BOT"
	BotID     string // default "B0BOT"
	AppID     string // default "A0APP"
	// TLS serves HTTPS and WSS with a test certificate (CertPEM).
	TLS bool
	// PingEvery is how often the socket sends a WebSocket ping (default 1 s).
	PingEvery time.Duration
}

// Post is one chat.postMessage call the fake answered ok.
type Post struct {
	Channel  string
	Text     string
	ThreadTS string
	TS       string // the ts the fake gave the posted message
	// Metadata is the message metadata the post carried, nil without.
	Metadata *Metadata
	// Blocks are the post's Block Kit blocks, nil without (approvals.go).
	Blocks []Block
}

// Metadata is Slack's message metadata: an event type and its payload.
type Metadata struct {
	EventType    string         `json:"event_type"`
	EventPayload map[string]any `json:"event_payload"`
}

// message is one message of the workspace's history: delivered events and
// the bot's posts, as conversations.history and conversations.replies
// return them.
type message struct {
	Channel  string
	TS       string
	ThreadTS string
	User     string
	BotID    string
	Text     string
	Metadata *Metadata
}

// Event is an inner Events API event ("message" or "app_mention").
type Event struct {
	Type        string `json:"type"`
	Subtype     string `json:"subtype,omitempty"`
	Channel     string `json:"channel,omitempty"`
	ChannelType string `json:"channel_type,omitempty"`
	User        string `json:"user,omitempty"`
	BotID       string `json:"bot_id,omitempty"`
	Text        string `json:"text,omitempty"`
	TS          string `json:"ts,omitempty"`
	ThreadTS    string `json:"thread_ts,omitempty"`
	EventTS     string `json:"event_ts,omitempty"`
	Team        string `json:"team,omitempty"`
	Files       []File `json:"files,omitempty"`
}

// Server is the fake Slack.
type Server struct {
	o   Options
	srv *httptest.Server

	mu            sync.Mutex
	changed       chan struct{} // closed and replaced on every change
	tickets       map[string]bool
	conns         []*wsConn
	connects      int
	opens         int
	breakNext     int
	failOpen      []string
	envelopes     map[string]*envelope
	acks          []string
	posts         []Post
	rateLimits    []time.Duration
	rlSkip        int // posts that succeed before rateLimits apply
	refusals      map[string]string
	names         map[string]string
	seq           int
	history       []message
	holdPosts     chan struct{} // non-nil: chat.postMessage answers wait for it
	heldPosts     int
	historyReads  int               // conversations.history and conversations.replies calls
	hold          chan struct{}     // non-nil: handshakes wait for it to close
	held          int               // handshakes waiting on hold
	timeline      []string          // "open N" / "close N" per WebSocket, in order
	silent        atomic.Bool       // no WebSocket pings while set
	progress      progressState     // progress.go
	files         fileState         // files.go
	shared        map[string][]byte // Share: file id → bytes
	sharedFetches int
	userGroups    []UserGroup // approvals.go
	groupsRefusal string      // usergroups.list's error code, "" for ok
	groupReads    int
}

type envelope struct {
	kind     string // "" for events_api; "interactive"
	payload  json.RawMessage
	attempts int
	acked    bool
	retried  bool // a later envelope carries the same event
}

type wsConn struct {
	n       int // 1-based, in the order connections opened
	ws      *websocket.Conn
	writeMu sync.Mutex
	done    chan struct{}
}

// New starts a fake Slack; it stops when the test ends.
func New(t testing.TB, o Options) *Server {
	t.Helper()
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.AppToken, "xapp-1-test")
	def(&o.BotToken, "xoxb-test")
	def(&o.TeamID, "T0TEST")
	def(&o.BotUserID, "U0BOT")
	def(&o.BotID, "B0BOT")
	def(&o.AppID, "A0APP")
	if o.PingEvery <= 0 {
		o.PingEvery = time.Second
	}
	s := &Server{
		o:         o,
		changed:   make(chan struct{}),
		tickets:   make(map[string]bool),
		envelopes: make(map[string]*envelope),
		refusals:  make(map[string]string),
		names:     map[string]string{"C0CHAN": "general"},
	}
	mux := http.NewServeMux()
	s.handleProgress(mux)
	s.handleFiles(mux)
	mux.HandleFunc("POST /api/usergroups.list", s.userGroupsList)
	mux.HandleFunc("POST /api/apps.connections.open", s.connectionsOpen)
	mux.HandleFunc("POST /api/auth.test", s.authTest)
	mux.HandleFunc("POST /api/chat.postMessage", s.postMessage)
	mux.HandleFunc("POST /api/conversations.info", s.conversationsInfo)
	mux.HandleFunc("POST /api/conversations.history", s.conversationsHistory)
	mux.HandleFunc("POST /api/conversations.replies", s.conversationsReplies)
	mux.HandleFunc("GET /link/", s.link)
	mux.HandleFunc("GET /files-pri/{file...}", s.sharedFile)
	if o.TLS {
		s.srv = httptest.NewTLSServer(mux)
	} else {
		s.srv = httptest.NewServer(mux)
	}
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and its sockets.
func (s *Server) Close() {
	s.Drop()
	s.srv.Close()
}

// APIURL is the Web API base to configure (base_url), ending in "/".
func (s *Server) APIURL() string { return s.srv.URL + "/api/" }

// Options returns the workspace's options with defaults filled in.
func (s *Server) Options() Options { return s.o }

// CertPEM is the PEM certificate of a TLS fake (for ca_file).
func (s *Server) CertPEM() []byte {
	if s.srv.Certificate() == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wait blocks until cond (called with s.mu held) is true or ctx ends.
func (s *Server) wait(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// WaitConnections waits until n WebSocket connections have been made in
// all (a reconnect makes the count grow) and the newest is open.
func (s *Server) WaitConnections(ctx context.Context, n int) error {
	err := s.wait(ctx, func() bool { return s.connects >= n && len(s.conns) > 0 })
	if err != nil {
		return fmt.Errorf("waiting for Socket Mode connection %d: %w", n, err)
	}
	return nil
}

// Connections is how many WebSocket connections were made in all.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connects
}

// Opens is how many times apps.connections.open was called.
func (s *Server) Opens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens
}

// BreakHandshakes makes the next n WebSocket handshakes fail: the fake
// closes the TCP connection in the middle of the upgrade.
func (s *Server) BreakHandshakes(n int) {
	s.mu.Lock()
	s.breakNext += n
	s.mu.Unlock()
}

// HoldPosts makes chat.postMessage post the message and then hold its
// answer until release is called.
func (s *Server) HoldPosts() (release func()) { return s.gate(&s.holdPosts) }

// WaitHeldPost waits until a posted message's answer is held by HoldPosts.
func (s *Server) WaitHeldPost(ctx context.Context) error {
	if err := s.wait(ctx, func() bool { return s.heldPosts > 0 }); err != nil {
		return fmt.Errorf("waiting for a held post: %w", err)
	}
	return nil
}

// HistoryReads is how many conversations.history and conversations.replies
// calls the fake answered.
func (s *Server) HistoryReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.historyReads
}

// HoldHandshakes makes WebSocket handshakes wait (after apps.connections.open
// answered) until release is called, as a slow network would.
func (s *Server) HoldHandshakes() (release func()) { return s.gate(&s.hold) }

// gate puts a fresh channel in *slot for answers to wait on; release (once,
// however often it is called) empties the slot and lets them all go.
func (s *Server) gate(slot *chan struct{}) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	*slot = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			*slot = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

// WaitHeldHandshake waits until a handshake waits on HoldHandshakes.
func (s *Server) WaitHeldHandshake(ctx context.Context) error {
	if err := s.wait(ctx, func() bool { return s.held > 0 }); err != nil {
		return fmt.Errorf("waiting for a held handshake: %w", err)
	}
	return nil
}

// Timeline returns "open N" and "close N" for each WebSocket connection
// (numbered from 1 in the order they opened), in the order they happened.
func (s *Server) Timeline() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.timeline...)
}

// WaitClosed waits until connection n (numbered from 1) has closed.
func (s *Server) WaitClosed(ctx context.Context, n int) error {
	want := fmt.Sprintf("close %d", n)
	if err := s.wait(ctx, func() bool { return slices.Contains(s.timeline, want) }); err != nil {
		return fmt.Errorf("waiting for connection %d to close: %w", n, err)
	}
	return nil
}

// FailOpen makes the next apps.connections.open calls answer ok:false with
// these errors, one per call.
func (s *Server) FailOpen(codes ...string) {
	s.mu.Lock()
	s.failOpen = append(s.failOpen, codes...)
	s.mu.Unlock()
}

// RateLimit makes the next chat.postMessage calls answer 429 with these
// Retry-After waits (whole seconds), one per call.
func (s *Server) RateLimit(waits ...time.Duration) {
	s.mu.Lock()
	s.rateLimits = append(s.rateLimits, waits...)
	s.mu.Unlock()
}

// RateLimitAfter lets the next n chat.postMessage calls succeed, then
// answers 429 with these Retry-After waits, one per call.
func (s *Server) RateLimitAfter(n int, waits ...time.Duration) {
	s.mu.Lock()
	s.rlSkip = n
	s.rateLimits = append(s.rateLimits, waits...)
	s.mu.Unlock()
}

// SetChannelName names a channel for conversations.info ("" makes it
// unknown: channel_not_found). C0CHAN is "general" from the start.
func (s *Server) SetChannelName(channel, name string) {
	s.mu.Lock()
	if name == "" {
		delete(s.names, channel)
	} else {
		s.names[channel] = name
	}
	s.mu.Unlock()
}

// Refuse makes chat.postMessage to channel answer ok:false with code
// (channel_not_found, not_in_channel, is_archived, ...).
func (s *Server) Refuse(channel, code string) {
	s.mu.Lock()
	s.refusals[channel] = code
	s.mu.Unlock()
}

// Posts returns the messages posted so far, in order.
func (s *Server) Posts() []Post {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Post(nil), s.posts...)
}

// WaitPosts waits until at least n messages were posted and returns them.
func (s *Server) WaitPosts(ctx context.Context, n int) ([]Post, error) {
	if err := s.wait(ctx, func() bool { return len(s.posts) >= n }); err != nil {
		return s.Posts(), fmt.Errorf("waiting for %d posts: %w", n, err)
	}
	return s.Posts(), nil
}

// Acked reports whether the envelope was acknowledged.
func (s *Server) Acked(envelopeID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.envelopes[envelopeID]
	return e != nil && e.acked
}

// Acks returns the acknowledged envelope ids in the order they came.
func (s *Server) Acks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.acks...)
}

// WaitAck waits until the envelope is acknowledged.
func (s *Server) WaitAck(ctx context.Context, envelopeID string) error {
	err := s.wait(ctx, func() bool {
		e := s.envelopes[envelopeID]
		return e != nil && e.acked
	})
	if err != nil {
		return fmt.Errorf("waiting for the ack of %s: %w", envelopeID, err)
	}
	return nil
}

// Callback wraps ev in an event_callback payload as the Events API sends it
// (the HTTP body in events mode, the envelope payload in Socket Mode). The
// message joins the channel's history (conversations.history, .replies).
func (s *Server) Callback(ev Event) []byte {
	s.mu.Lock()
	s.seq++
	n := s.seq
	s.mu.Unlock()
	if ev.EventTS == "" {
		ev.EventTS = ev.TS
	}
	if ev.Channel != "" && ev.TS != "" {
		s.mu.Lock()
		if !slices.ContainsFunc(s.history, func(m message) bool { return m.Channel == ev.Channel && m.TS == ev.TS }) {
			s.history = append(s.history, message{Channel: ev.Channel, TS: ev.TS, ThreadTS: ev.ThreadTS, User: ev.User, BotID: ev.BotID, Text: ev.Text})
		}
		s.mu.Unlock()
	}
	body, _ := json.Marshal(map[string]any{
		"token":      "verification-token",
		"team_id":    s.o.TeamID,
		"api_app_id": s.o.AppID,
		"event":      ev,
		"type":       "event_callback",
		"event_id":   fmt.Sprintf("Ev%08d", n),
		"event_time": time.Now().Unix(),
		"authorizations": []map[string]any{
			{"team_id": s.o.TeamID, "user_id": s.o.BotUserID, "is_bot": true, "is_enterprise_install": false},
		},
		"is_ext_shared_channel": false,
		"event_context":         fmt.Sprintf("4-ctx-%d", n),
	})
	return body
}

// Deliver sends ev in an events_api envelope on the newest socket and
// returns the envelope id.
func (s *Server) Deliver(ctx context.Context, ev Event) (string, error) {
	return s.DeliverPayload(ctx, s.Callback(ev))
}

// DeliverPayload sends payload in an events_api envelope.
func (s *Server) DeliverPayload(ctx context.Context, payload []byte) (string, error) {
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("env-%04d", s.seq)
	s.envelopes[id] = &envelope{payload: payload}
	s.mu.Unlock()
	return id, s.sendEnvelope(ctx, id, 0, "")
}

// Redeliver sends an envelope's payload again as Slack's retry of an
// unacknowledged event does: a new envelope id, retry_attempt counted up,
// retry_reason "timeout". It returns the new envelope id.
func (s *Server) Redeliver(ctx context.Context, envelopeID string) (string, error) {
	s.mu.Lock()
	old := s.envelopes[envelopeID]
	if old == nil {
		s.mu.Unlock()
		return "", fmt.Errorf("no envelope %s", envelopeID)
	}
	s.seq++
	id := fmt.Sprintf("env-%04d", s.seq)
	e := &envelope{payload: old.payload, attempts: old.attempts + 1}
	s.envelopes[id] = e
	old.retried = true
	s.mu.Unlock()
	return id, s.sendEnvelope(ctx, id, e.attempts, "timeout")
}

// RedeliverUnacked redelivers every envelope that was neither acknowledged
// nor redelivered yet, as Slack does after its acknowledgement timeout, and
// returns the new envelope ids.
func (s *Server) RedeliverUnacked(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	var pending []string
	for id, e := range s.envelopes {
		if !e.acked && !e.retried {
			pending = append(pending, id)
		}
	}
	s.mu.Unlock()
	slices.Sort(pending)
	var ids []string
	for _, id := range pending {
		nid, err := s.Redeliver(ctx, id)
		if err != nil {
			return ids, err
		}
		ids = append(ids, nid)
	}
	return ids, nil
}

// PostEvent sends ev to an Events API endpoint as Slack does: signed with
// secret at the current time. It returns the HTTP status.
func (s *Server) PostEvent(ctx context.Context, url, secret string, ev Event) (int, error) {
	req, err := SignedRequest(ctx, url, secret, time.Now(), s.Callback(ev))
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("cannot post the event: %w", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func (s *Server) sendEnvelope(ctx context.Context, id string, attempt int, reason string) error {
	s.mu.Lock()
	payload, kind := s.envelopes[id].payload, s.envelopes[id].kind
	s.mu.Unlock()
	if kind == "" {
		kind = "events_api"
	}
	frame, _ := json.Marshal(map[string]any{
		"envelope_id":              id,
		"payload":                  json.RawMessage(payload),
		"type":                     kind,
		"accepts_response_payload": false,
		"retry_attempt":            attempt,
		"retry_reason":             reason,
	})
	return s.SendRaw(ctx, frame)
}

// SendRaw writes one text frame as it is on the newest socket, waiting for
// a socket to be open.
func (s *Server) SendRaw(ctx context.Context, frame []byte) error {
	var c *wsConn
	err := s.wait(ctx, func() bool {
		if len(s.conns) > 0 {
			c = s.conns[len(s.conns)-1]
		}
		return c != nil
	})
	if err != nil {
		return fmt.Errorf("no Socket Mode connection to send on: %w", err)
	}
	return c.write(websocket.TextMessage, frame)
}

// Disconnect sends Slack's disconnect frame (reason refresh_requested,
// warning, link_disabled) on every open socket.
func (s *Server) Disconnect(reason string) error {
	frame, _ := json.Marshal(map[string]any{
		"type":       "disconnect",
		"reason":     reason,
		"debug_info": map[string]any{"host": "applink-fake"},
	})
	var errs []error
	for _, c := range s.openConns() {
		errs = append(errs, c.write(websocket.TextMessage, frame))
	}
	return errors.Join(errs...)
}

// SetSilent stops (true) or resumes the WebSocket pings of every socket:
// a connection gone quiet, as a half-open TCP connection is.
func (s *Server) SetSilent(silent bool) { s.silent.Store(silent) }

// Drop cuts every open socket without a close frame, as a network failure
// does.
func (s *Server) Drop() {
	for _, c := range s.openConns() {
		_ = c.ws.NetConn().Close()
	}
}

func (s *Server) openConns() []*wsConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*wsConn(nil), s.conns...)
}

func (c *wsConn) write(kind int, data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.ws.WriteMessage(kind, data); err != nil {
		return fmt.Errorf("cannot write to the Socket Mode connection: %w", err)
	}
	return nil
}

// token is the request's credential: the Authorization bearer or the
// "token" form field, both accepted by Slack's Web API.
func token(r *http.Request) string {
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return t
	}
	_ = r.ParseForm()
	return r.PostForm.Get("token")
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

func refuse(w http.ResponseWriter, code string) {
	reply(w, map[string]any{"ok": false, "error": code})
}

func (s *Server) connectionsOpen(w http.ResponseWriter, r *http.Request) {
	tok := token(r)
	s.mu.Lock()
	s.opens++
	var fail string
	if len(s.failOpen) > 0 {
		fail, s.failOpen = s.failOpen[0], s.failOpen[1:]
	}
	s.seq++
	ticket := fmt.Sprintf("ticket-%d", s.seq)
	if fail == "" && tok == s.o.AppToken {
		s.tickets[ticket] = true
	}
	s.notify()
	s.mu.Unlock()
	switch {
	case tok == "":
		refuse(w, "not_authed")
	case fail != "":
		refuse(w, fail)
	case strings.HasPrefix(tok, "xoxb-"):
		refuse(w, "not_allowed_token_type")
	case tok != s.o.AppToken:
		refuse(w, "invalid_auth")
	default:
		scheme := "ws"
		if s.o.TLS {
			scheme = "wss"
		}
		host := strings.TrimPrefix(strings.TrimPrefix(s.srv.URL, "http://"), "https://")
		reply(w, map[string]any{"ok": true, "url": fmt.Sprintf("%s://%s/link/?ticket=%s&app_id=%s", scheme, host, ticket, s.o.AppID)})
	}
}

func (s *Server) authTest(w http.ResponseWriter, r *http.Request) {
	if tok := token(r); tok != s.o.BotToken {
		if tok == "" {
			refuse(w, "not_authed")
		} else {
			refuse(w, "invalid_auth")
		}
		return
	}
	reply(w, map[string]any{
		"ok": true, "url": "https://berth-test.slack.com/", "team": "Berth Test", "user": "berth",
		"team_id": s.o.TeamID, "user_id": s.o.BotUserID, "bot_id": s.o.BotID, "is_enterprise_install": false,
	})
}

func (s *Server) conversationsInfo(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if tok := token(r); tok != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel := r.PostForm.Get("channel")
	s.mu.Lock()
	name, ok := s.names[channel]
	s.mu.Unlock()
	if !ok {
		refuse(w, "channel_not_found")
		return
	}
	reply(w, map[string]any{"ok": true, "channel": map[string]any{
		"id": channel, "name": name, "is_channel": true, "is_member": true, "created": 1449252889,
	}})
}

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if tok := token(r); tok != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel, text, thread := r.PostForm.Get("channel"), r.PostForm.Get("text"), r.PostForm.Get("thread_ts")
	s.mu.Lock()
	if len(s.rateLimits) > 0 && s.rlSkip > 0 {
		s.rlSkip--
	} else if len(s.rateLimits) > 0 {
		wait := s.rateLimits[0]
		s.rateLimits = s.rateLimits[1:]
		s.notify()
		s.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"ok":false,"error":"ratelimited"}`))
		return
	}
	code := s.refusals[channel]
	switch {
	case code != "":
	case channel == "":
		code = "channel_not_found"
	case text == "":
		code = "no_text"
	case len([]rune(text)) > 40000:
		code = "msg_too_long"
	}
	if code != "" {
		s.mu.Unlock()
		refuse(w, code)
		return
	}
	var meta *Metadata
	if raw := r.PostForm.Get("metadata"); raw != "" {
		meta = &Metadata{}
		if err := json.Unmarshal([]byte(raw), meta); err != nil || meta.EventType == "" {
			s.mu.Unlock()
			refuse(w, "invalid_metadata_format")
			return
		}
	}
	blocks, bad := parseBlocks(r.PostForm.Get("blocks"))
	if bad != "" {
		s.mu.Unlock()
		refuse(w, bad)
		return
	}
	s.seq++
	ts := fmt.Sprintf("%d.%06d", time.Now().Unix(), s.seq)
	s.posts = append(s.posts, Post{Channel: channel, Text: text, ThreadTS: thread, TS: ts, Metadata: meta, Blocks: blocks})
	s.history = append(s.history, message{Channel: channel, TS: ts, ThreadTS: thread, User: s.o.BotUserID, BotID: s.o.BotID, Text: text, Metadata: meta})
	hold := s.holdPosts
	if hold != nil {
		s.heldPosts++
	}
	s.notify()
	s.mu.Unlock()
	if hold != nil {
		// Posted, but the answer waits: a crash now leaves a posted reply
		// its sender never heard about.
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}
	msg := map[string]any{"type": "message", "text": text, "user": s.o.BotUserID, "bot_id": s.o.BotID, "ts": ts}
	if thread != "" {
		msg["thread_ts"] = thread
	}
	reply(w, map[string]any{"ok": true, "channel": channel, "ts": ts, "message": msg})
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

func (s *Server) link(w http.ResponseWriter, r *http.Request) {
	ticket := r.URL.Query().Get("ticket")
	s.mu.Lock()
	valid := s.tickets[ticket]
	delete(s.tickets, ticket) // one-time URL
	broken := s.breakNext > 0
	if broken {
		s.breakNext--
	}
	hold := s.hold
	if hold != nil {
		s.held++
		s.notify()
	}
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
	}
	if !valid {
		http.Error(w, "invalid or used ticket", http.StatusUnauthorized)
		return
	}
	if broken {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_, _ = conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"))
				_ = conn.Close()
				return
			}
		}
		http.Error(w, "broken", http.StatusBadGateway)
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	c := &wsConn{ws: ws, done: make(chan struct{})}
	hello, _ := json.Marshal(map[string]any{
		"type":            "hello",
		"num_connections": 1,
		"debug_info":      map[string]any{"host": "applink-fake", "build_number": 1, "approximate_connection_time": 18060},
		"connection_info": map[string]any{"app_id": s.o.AppID},
	})
	_ = ws.WriteControl(websocket.PingMessage, []byte("hello"), time.Now().Add(time.Second))
	// Listed as open before hello goes out (so that the timeline has it
	// before the client can react to hello), but nothing is sent on it
	// before hello: writeMu is held until then.
	c.writeMu.Lock()
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.connects++
	c.n = s.connects
	s.timeline = append(s.timeline, fmt.Sprintf("open %d", c.n))
	s.notify()
	s.mu.Unlock()
	_ = ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	err = ws.WriteMessage(websocket.TextMessage, hello)
	c.writeMu.Unlock()
	if err != nil {
		_ = ws.Close()
	}
	go s.ping(c)
	s.read(c)
}

func (s *Server) ping(c *wsConn) {
	t := time.NewTicker(s.o.PingEvery)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if s.silent.Load() {
				continue
			}
			if err := c.ws.WriteControl(websocket.PingMessage, []byte("ping"), time.Now().Add(time.Second)); err != nil {
				return
			}
		}
	}
}

// read records acknowledgements until the socket closes.
func (s *Server) read(c *wsConn) {
	defer func() {
		close(c.done)
		_ = c.ws.Close()
		s.mu.Lock()
		for i, x := range s.conns {
			if x == c {
				s.conns = append(s.conns[:i], s.conns[i+1:]...)
				break
			}
		}
		s.timeline = append(s.timeline, fmt.Sprintf("close %d", c.n))
		s.notify()
		s.mu.Unlock()
	}()
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		var ack struct {
			EnvelopeID string `json:"envelope_id"`
		}
		if json.Unmarshal(data, &ack) != nil || ack.EnvelopeID == "" {
			continue
		}
		s.mu.Lock()
		if e := s.envelopes[ack.EnvelopeID]; e != nil && !e.acked {
			e.acked = true
			s.acks = append(s.acks, ack.EnvelopeID)
		}
		s.notify()
		s.mu.Unlock()
	}
}

// Sign returns the X-Slack-Request-Timestamp and X-Slack-Signature headers
// Slack sends with body at ts, signed with secret.
func Sign(secret string, ts time.Time, body []byte) (timestamp, signature string) {
	timestamp = strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%s:", timestamp)
	mac.Write(body)
	return timestamp, "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// SignedRequest builds an Events API request to url as Slack sends it.
func SignedRequest(ctx context.Context, url, secret string, ts time.Time, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("cannot build the Events API request: %w", err)
	}
	timestamp, sig := Sign(secret, ts, body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Slack-Request-Timestamp", timestamp)
	req.Header.Set("X-Slack-Signature", sig)
	return req, nil
}

// conversationsHistory answers conversations.history: the channel's
// messages outside threads (and thread parents), newest first, paged with
// limit and cursor; metadata only with include_all_metadata.
func (s *Server) conversationsHistory(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if tok := token(r); tok != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel := r.PostForm.Get("channel")
	s.mu.Lock()
	s.historyReads++
	var msgs []message
	for _, m := range s.history {
		if m.Channel == channel && (m.ThreadTS == "" || m.ThreadTS == m.TS) {
			msgs = append(msgs, m)
		}
	}
	_, known := s.names[channel]
	s.mu.Unlock()
	if !known && len(msgs) == 0 && !strings.HasPrefix(channel, "D") {
		refuse(w, "channel_not_found")
		return
	}
	slices.SortFunc(msgs, func(a, b message) int { return strings.Compare(b.TS, a.TS) })
	replyPage(w, r, msgs)
}

// conversationsReplies answers conversations.replies: the thread's parent
// and its replies, oldest first, paged with limit and cursor; metadata only
// with include_all_metadata; thread_not_found for a ts that is no message.
func (s *Server) conversationsReplies(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if tok := token(r); tok != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	channel, ts := r.PostForm.Get("channel"), r.PostForm.Get("ts")
	s.mu.Lock()
	s.historyReads++
	var msgs []message
	for _, m := range s.history {
		if m.Channel == channel && (m.TS == ts || m.ThreadTS == ts) {
			msgs = append(msgs, m)
		}
	}
	s.mu.Unlock()
	if ts == "" || len(msgs) == 0 {
		refuse(w, "thread_not_found")
		return
	}
	slices.SortFunc(msgs, func(a, b message) int { return strings.Compare(a.TS, b.TS) })
	replyPage(w, r, msgs)
}

// replyPage answers one page of msgs: limit (default 100, at most 1000)
// from the offset the cursor names.
func replyPage(w http.ResponseWriter, r *http.Request, msgs []message) {
	limit, err := strconv.Atoi(r.PostForm.Get("limit"))
	if err != nil || limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	from := 0
	if c := r.PostForm.Get("cursor"); c != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(c, "page:"))
		if err != nil || n < 0 || n > len(msgs) {
			refuse(w, "invalid_cursor")
			return
		}
		from = n
	}
	to := min(from+limit, len(msgs))
	withMeta := r.PostForm.Get("include_all_metadata") == "1" || r.PostForm.Get("include_all_metadata") == "true"
	out := make([]map[string]any, 0, to-from)
	for _, m := range msgs[from:to] {
		o := map[string]any{"type": "message", "ts": m.TS, "text": m.Text}
		if m.User != "" {
			o["user"] = m.User
		}
		if m.BotID != "" {
			o["bot_id"] = m.BotID
		}
		if m.ThreadTS != "" {
			o["thread_ts"] = m.ThreadTS
		}
		if withMeta && m.Metadata != nil {
			o["metadata"] = m.Metadata
		}
		out = append(out, o)
	}
	next := ""
	if to < len(msgs) {
		next = fmt.Sprintf("page:%d", to)
	}
	reply(w, map[string]any{"ok": true, "messages": out, "has_more": next != "",
		"response_metadata": map[string]any{"next_cursor": next}})
}

// File is a file shared with a message, as a message event carries it.
type File struct {
	ID                 string `json:"id"`
	Name               string `json:"name"`
	Mimetype           string `json:"mimetype,omitempty"`
	Size               int64  `json:"size"`
	URLPrivate         string `json:"url_private"`
	URLPrivateDownload string `json:"url_private_download"`
}

// Share keeps data as a file of the workspace and returns it as a message
// event lists it: its url_private_download answers the bytes to the bot
// token only (anyone else gets Slack's sign-in page, with 200, as Slack
// does).
func (s *Server) Share(name, mimetype string, data []byte) File {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared == nil {
		s.shared = map[string][]byte{}
	}
	id := fmt.Sprintf("F%08d", len(s.shared)+1)
	s.shared[id] = data
	u := s.srv.URL + "/files-pri/T0TEAM-" + id + "/download/" + url.PathEscape(name)
	return File{ID: id, Name: name, Mimetype: mimetype, Size: int64(len(data)), URLPrivate: u, URLPrivateDownload: u}
}

// SharedFetches is how many times a shared file was downloaded with the
// bot token.
func (s *Server) SharedFetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sharedFetches
}

func (s *Server) sharedFile(w http.ResponseWriter, r *http.Request) {
	team, _, _ := strings.Cut(r.PathValue("file"), "/")
	_, id, _ := strings.Cut(team, "-")
	s.mu.Lock()
	data, ok := s.shared[id]
	authorized := token(r) == s.o.BotToken
	if ok && authorized {
		s.sharedFetches++
	}
	s.mu.Unlock()
	switch {
	case !authorized:
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<!DOCTYPE html><html><body>Sign in to Slack</body></html>")
	case !ok:
		http.NotFound(w, r)
	default:
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
	}
}
