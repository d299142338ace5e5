// Package discordtest is an in-process fake of Discord for tests: the
// Gateway (v10, JSON: HELLO, IDENTIFY → READY, RESUME → replay + RESUMED or
// INVALID_SESSION, heartbeats and their ACKs, close codes; the session
// outlives its connection unless the client closes with 1000 or 1001), the
// REST routes berth uses (GET /api/v10/gateway/bot, GET
// /api/v10/channels/{id}, POST /api/v10/channels/{id}/messages with nonce and
// enforce_nonce, POST /api/v10/channels/{id}/typing, POST
// /api/v10/webhooks/{app}/{token}, POST
// /api/v10/interactions/{id}/{token}/callback) with rate-limit headers and
// 429s, message components checked against Discord's limits
// (components.go), and Ed25519-signed interaction requests, button clicks
// over HTTP or the Gateway among them (interactions.go).
// It follows discord/discord-api-docs (developers/events/gateway.mdx,
// gateway-events.mdx, topics/rate-limits.mdx, interactions/receiving-and-responding.mdx).
package discordtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Intent bits the fake checks (gateway.mdx, Gateway Intents).
const (
	intentMessageContent = 1 << 15
)

// Server is a fake Discord.
type Server struct {
	// URL is the REST base (Options.BaseURL); GatewayURL what GET
	// /gateway/bot answers; ResumeURL READY's resume_gateway_url.
	URL, GatewayURL, ResumeURL string
	Token                      string // the bot token it accepts
	BotID                      string // READY's user id
	AppID                      string
	PublicKey                  ed25519.PublicKey
	privateKey                 ed25519.PrivateKey

	srv *httptest.Server

	wmu sync.Mutex // orders writes of dispatches to the live connection

	mu                sync.Mutex
	changed           chan struct{} // closed and replaced on every change
	live              *websocket.Conn
	sessionID         string
	seq               int64
	events            []event
	allowResume       bool
	contentIntent     bool
	heartbeatInterval int
	ackHeartbeats     bool
	handshakes        []Handshake
	heartbeats        []int64
	posts             []Post
	typing            []string
	limits            []Limit
	refusals          map[string]Refusal
	breakNext         []string
	rejectIntents     bool
	channels          map[string]map[string]any // GET /channels/{id}: what GUILD_CREATE listed
	nonces            map[string]sentNonce      // enforce_nonce: author NUL nonce → the message it made
	postRequests      int
	loseResponses     int
	nonceWindow       time.Duration
	progress          progressState                 // progress.go
	interactions      map[string]*issuedInteraction // "{id}/{token}" (interactions.go)
	callbacks         []Callback
}

// sentNonce is a message created with enforce_nonce, kept for the window in
// which the same nonce returns it.
type sentNonce struct {
	message map[string]any
	at      time.Time
}

type event struct {
	seq int64
	t   string
	d   json.RawMessage
}

// Handshake is one Gateway connection's opening.
type Handshake struct {
	Path      string // /gateway or /resume
	Op        int    // 2 IDENTIFY, 6 RESUME
	SessionID string // RESUME's session_id
	Seq       int64  // RESUME's seq
	Token     string
	Intents   int
	Resumed   bool // the RESUME was honoured
}

// Post is one message berth posted.
type Post struct {
	ID      string // the message id the fake gave it
	Channel string // channel (or thread) id; "" for a follow-up
	Webhook string // "{app}/{token}" for an interaction follow-up
	Content string
	ReplyTo string // message_reference.message_id
	Nonce   string
	// EnforceNonce is enforce_nonce: a repeated nonce returned the first
	// message instead of posting again.
	EnforceNonce bool
	Mentions     json.RawMessage
	Authority    string // the Authorization header
	// Files are the message's attachments, uploaded with it (files.go).
	Files []File
	// Components are the message's action rows (components.go).
	Components []Row
}

// Limit makes the next REST POST answer 429 (Global: the global limit), or,
// with Status 200, succeed with an empty bucket that resets after ResetAfter.
type Limit struct {
	RetryAfter float64
	Global     bool
	ResetAfter float64 // for an exhausted bucket
	Exhaust    bool
}

// Refusal is how the fake answers posts to a channel (or webhook app).
type Refusal struct {
	Status  int
	Code    int
	Message string
}

// New starts a fake Discord; it stops when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{
		Token:             "fake-bot-token." + randomHex(12),
		BotID:             "100000000000000001",
		AppID:             "200000000000000002",
		PublicKey:         pub,
		privateKey:        priv,
		changed:           make(chan struct{}),
		allowResume:       true,
		contentIntent:     true,
		heartbeatInterval: 45000,
		ackHeartbeats:     true,
		refusals:          map[string]Refusal{},
		channels:          map[string]map[string]any{},
		nonces:            map[string]sentNonce{},
		nonceWindow:       5 * time.Minute,
		interactions:      map[string]*issuedInteraction{},
	}
	mux := http.NewServeMux()
	s.handleProgress(mux)
	mux.HandleFunc("GET /api/v10/gateway/bot", s.gatewayBot)
	mux.HandleFunc("POST /api/v10/channels/{channel}/messages", s.channelMessage)
	mux.HandleFunc("POST /api/v10/channels/{channel}/typing", s.channelTyping)
	mux.HandleFunc("GET /api/v10/channels/{channel}", s.getChannel)
	mux.HandleFunc("POST /api/v10/webhooks/{app}/{token}", s.followup)
	mux.HandleFunc("POST /api/v10/interactions/{id}/{token}/callback", s.interactionCallback)
	mux.HandleFunc("GET /gateway", func(w http.ResponseWriter, r *http.Request) { s.gateway(w, r, "/gateway") })
	mux.HandleFunc("GET /resume", func(w http.ResponseWriter, r *http.Request) { s.gateway(w, r, "/resume") })
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	ws := "ws" + strings.TrimPrefix(s.srv.URL, "http")
	s.GatewayURL, s.ResumeURL = ws+"/gateway", ws+"/resume"
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and drops the live connection.
func (s *Server) Close() {
	s.Drop()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// WaitFor waits until cond holds; cond is checked again after every change
// of the fake's state (a connection, a handshake, a heartbeat, a post).
func (s *Server) WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("fake discord: timed out waiting for %s", what)
		}
	}
}

// SetAllowResume decides whether a RESUME is honoured (else op 9, d false).
func (s *Server) SetAllowResume(ok bool) { s.mu.Lock(); s.allowResume = ok; s.mu.Unlock() }

// SetContentIntent decides whether the bot has the MESSAGE_CONTENT intent;
// without it guild messages that do not mention the bot arrive without
// content, embeds and attachments, as Discord sends them.
func (s *Server) SetContentIntent(ok bool) { s.mu.Lock(); s.contentIntent = ok; s.mu.Unlock() }

// RejectPrivilegedIntents makes the gateway close with 4014 when IDENTIFY
// asks for MESSAGE_CONTENT.
func (s *Server) RejectPrivilegedIntents() { s.mu.Lock(); s.rejectIntents = true; s.mu.Unlock() }

// SetHeartbeat sets HELLO's heartbeat_interval (ms) and whether heartbeats
// are acknowledged.
func (s *Server) SetHeartbeat(intervalMS int, ack bool) {
	s.mu.Lock()
	s.heartbeatInterval, s.ackHeartbeats = intervalMS, ack
	s.mu.Unlock()
}

// BreakNextHandshake makes the next connection misbehave: "close" closes
// before HELLO, "silent" sends nothing at all, "garbage" sends a non-JSON
// frame instead of HELLO,
// "close-after-hello" closes after HELLO without answering IDENTIFY.
func (s *Server) BreakNextHandshake(mode string) {
	s.mu.Lock()
	s.breakNext = append(s.breakNext, mode)
	s.mu.Unlock()
}

// Handshakes lists the connections' openings so far.
func (s *Server) Handshakes() []Handshake {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handshakes)
}

// WaitHandshakes waits for n completed handshakes (READY or RESUMED sent).
func (s *Server) WaitHandshakes(t testing.TB, n int) []Handshake {
	t.Helper()
	s.WaitFor(t, fmt.Sprintf("%d gateway handshakes", n), func() bool { return len(s.Handshakes()) >= n && s.Connected() })
	return s.Handshakes()
}

// Heartbeats lists the d of each heartbeat received.
func (s *Server) Heartbeats() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.heartbeats)
}

// Connected reports whether a gateway connection is live.
func (s *Server) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live != nil
}

// Drop cuts the live gateway connection without a close frame; the session
// stays resumable.
func (s *Server) Drop() {
	s.mu.Lock()
	c := s.live
	s.live = nil
	s.notify()
	s.mu.Unlock()
	if c != nil {
		c.CloseNow()
	}
}

// CloseWith closes the live connection with a close code.
func (s *Server) CloseWith(code int, reason string) {
	s.mu.Lock()
	c := s.live
	s.live = nil
	s.notify()
	s.mu.Unlock()
	if c != nil {
		_ = c.Close(websocket.StatusCode(code), reason)
	}
}

// Dispatch sends an op-0 event with the next sequence number (kept for
// replay on RESUME) and returns that number. While no connection is live
// the event waits for a RESUME.
func (s *Server) Dispatch(t string, d any) int64 {
	raw, err := json.Marshal(d)
	if err != nil {
		panic(err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if t == "MESSAGE_CREATE" && !s.contentIntent {
		raw = stripContent(raw, s.BotID)
	}
	s.seq++
	e := event{seq: s.seq, t: t, d: raw}
	s.events = append(s.events, e)
	c := s.live
	s.mu.Unlock()
	if c != nil {
		_ = writeEvent(c, e)
	}
	return e.seq
}

// SendRaw writes a frame as it is to the live connection (garbage tests).
func (s *Server) SendRaw(typ websocket.MessageType, data []byte) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	c := s.live
	s.mu.Unlock()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Write(ctx, typ, data)
	}
}

func stripContent(raw json.RawMessage, botID string) json.RawMessage {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	if m["guild_id"] == nil || m["guild_id"] == "" {
		return raw // DMs keep their content
	}
	if ms, ok := m["mentions"].([]any); ok {
		for _, u := range ms {
			if um, ok := u.(map[string]any); ok && um["id"] == botID {
				return raw
			}
		}
	}
	m["content"], m["embeds"], m["attachments"] = "", []any{}, []any{}
	out, _ := json.Marshal(m)
	return out
}

func writeEvent(c *websocket.Conn, e event) error {
	return writeJSON(c, map[string]any{"op": 0, "t": e.t, "s": e.seq, "d": e.d})
}

func writeJSON(c *websocket.Conn, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, data)
}

func (s *Server) gateway(w http.ResponseWriter, r *http.Request, path string) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	// Payloads sent by the app must not exceed 4096 bytes (gateway.mdx).
	c.SetReadLimit(4096)
	if r.URL.Query().Get("v") != "10" || r.URL.Query().Get("encoding") != "json" {
		_ = c.Close(4012, "Invalid API version")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()

	s.mu.Lock()
	mode := ""
	if len(s.breakNext) > 0 {
		mode, s.breakNext = s.breakNext[0], s.breakNext[1:]
	}
	interval := s.heartbeatInterval
	s.mu.Unlock()
	switch mode {
	case "close":
		_ = c.Close(websocket.StatusInternalError, "broken on purpose")
		return
	case "silent":
		_, _, _ = c.Read(ctx) // says nothing until the client gives up
		return
	case "garbage":
		_ = c.Write(ctx, websocket.MessageText, []byte("\x00garbage{"))
		_, _, _ = c.Read(ctx)
		return
	}
	if err := writeJSON(c, map[string]any{"op": 10, "d": map[string]any{"heartbeat_interval": interval}}); err != nil {
		return
	}
	if mode == "close-after-hello" {
		_, _, _ = c.Read(ctx)
		_ = c.Close(websocket.StatusInternalError, "broken on purpose")
		return
	}
	var hs Handshake
	hs.Path = path
	for hs.Op == 0 {
		op, d, err := readPayload(ctx, c)
		if err != nil {
			return
		}
		switch op {
		case 1:
			s.heartbeat(c, d)
		case 2, 6:
			hs.Op = op
			var id struct {
				Token     string `json:"token"`
				Intents   int    `json:"intents"`
				SessionID string `json:"session_id"`
				Seq       int64  `json:"seq"`
			}
			if json.Unmarshal(d, &id) != nil {
				_ = c.Close(4002, "Decode error")
				return
			}
			hs.Token, hs.Intents, hs.SessionID, hs.Seq = id.Token, id.Intents, id.SessionID, id.Seq
		default:
			_ = c.Close(4003, "Not authenticated")
			return
		}
	}
	if hs.Token != s.Token {
		s.record(hs)
		_ = c.Close(4004, "Authentication failed")
		return
	}
	if hs.Op == 2 {
		s.mu.Lock()
		reject := s.rejectIntents && hs.Intents&intentMessageContent != 0
		s.mu.Unlock()
		if reject {
			s.record(hs)
			_ = c.Close(4014, "Disallowed intent(s)")
			return
		}
		if !s.identify(c, hs) {
			return
		}
	} else if !s.resume(c, &hs) {
		// Invalid session (d false): the client must identify on a new connection.
		s.record(hs)
		_ = writeJSON(c, map[string]any{"op": 9, "d": false})
		_, _, _ = c.Read(ctx)
		return
	}
	s.readLoop(r.Context(), c)
}

func (s *Server) record(hs Handshake) {
	s.mu.Lock()
	s.handshakes = append(s.handshakes, hs)
	s.notify()
	s.mu.Unlock()
}

// identify starts a new session: READY with a fresh session id.
func (s *Server) identify(c *websocket.Conn, hs Handshake) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	s.sessionID = randomHex(8)
	s.seq++
	ready := event{seq: s.seq, t: "READY"}
	ready.d, _ = json.Marshal(map[string]any{
		"v":                  10,
		"user":               map[string]any{"id": s.BotID, "username": "berth-bot", "bot": true},
		"guilds":             []any{},
		"session_id":         s.sessionID,
		"resume_gateway_url": s.ResumeURL,
		"application":        map[string]any{"id": s.AppID, "flags": 0},
	})
	s.events = []event{ready}
	// Recorded before READY goes out, so a test that sees what the client
	// did after READY also sees the handshake.
	s.live = c
	s.handshakes = append(s.handshakes, hs)
	s.notify()
	s.mu.Unlock()
	return writeEvent(c, ready) == nil
}

// resume replays the events after hs.Seq and sends RESUMED.
func (s *Server) resume(c *websocket.Conn, hs *Handshake) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if !s.allowResume || hs.SessionID != s.sessionID || s.sessionID == "" {
		s.mu.Unlock()
		return false
	}
	var replay []event
	for _, e := range s.events {
		if e.seq > hs.Seq {
			replay = append(replay, e)
		}
	}
	s.seq++
	resumed := event{seq: s.seq, t: "RESUMED", d: json.RawMessage("null")}
	s.events = append(s.events, resumed)
	hs.Resumed = true
	s.live = c
	s.handshakes = append(s.handshakes, *hs)
	s.notify()
	s.mu.Unlock()
	for _, e := range append(replay, resumed) {
		if writeEvent(c, e) != nil {
			return false
		}
	}
	return true
}

func (s *Server) readLoop(ctx context.Context, c *websocket.Conn) {
	defer func() {
		s.mu.Lock()
		if s.live == c {
			s.live = nil
			s.notify()
		}
		s.mu.Unlock()
	}()
	for {
		op, d, err := readPayload(ctx, c)
		if err != nil {
			// gateway.mdx, Disconnecting: a client that closes with 1000 or
			// 1001 invalidates its session; any other way out keeps it.
			if code := websocket.CloseStatus(err); code == websocket.StatusNormalClosure || code == websocket.StatusGoingAway {
				s.mu.Lock()
				s.sessionID = ""
				s.notify()
				s.mu.Unlock()
			}
			return
		}
		if op == 1 {
			s.heartbeat(c, d)
		}
	}
}

func (s *Server) heartbeat(c *websocket.Conn, d json.RawMessage) {
	var seq int64
	_ = json.Unmarshal(d, &seq)
	s.mu.Lock()
	s.heartbeats = append(s.heartbeats, seq)
	ack := s.ackHeartbeats
	s.notify()
	s.mu.Unlock()
	if ack {
		_ = writeJSON(c, map[string]any{"op": 11})
	}
}

func readPayload(ctx context.Context, c *websocket.Conn) (int, json.RawMessage, error) {
	_, data, err := c.Read(ctx)
	if err != nil {
		return 0, nil, err
	}
	var p struct {
		Op int             `json:"op"`
		D  json.RawMessage `json:"d"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return -1, nil, nil
	}
	return p.Op, p.D, nil
}

// ---- REST ----

func (s *Server) gatewayBot(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	reply(w, http.StatusOK, map[string]any{
		"url": s.GatewayURL, "shards": 1,
		"session_start_limit": map[string]any{"total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1},
	})
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bot "+s.Token {
		reply(w, http.StatusUnauthorized, map[string]any{"message": "401: Unauthorized", "code": 0})
		return false
	}
	return true
}

// RateLimitNext queues limits for the next REST posts, in order.
func (s *Server) RateLimitNext(l ...Limit) {
	s.mu.Lock()
	s.limits = append(s.limits, l...)
	s.mu.Unlock()
}

// Refuse makes posts to channel (or to webhooks of app id) fail with r.
func (s *Server) Refuse(channel string, r Refusal) {
	s.mu.Lock()
	s.refusals[channel] = r
	s.mu.Unlock()
}

// Posts lists the messages posted so far, in arrival order.
func (s *Server) Posts() []Post {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.posts)
}

// WaitPosts waits until n messages were posted.
func (s *Server) WaitPosts(t testing.TB, n int) []Post {
	t.Helper()
	s.WaitFor(t, fmt.Sprintf("%d posts", n), func() bool { return len(s.Posts()) >= n })
	return s.Posts()
}

// Typing lists the channels typing was shown in.
func (s *Server) Typing() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.typing)
}

// limited answers a queued limit; true when the request was answered 429.
func (s *Server) limited(w http.ResponseWriter) bool {
	s.mu.Lock()
	var l *Limit
	if len(s.limits) > 0 {
		l = &s.limits[0]
		s.limits = s.limits[1:]
	}
	s.mu.Unlock()
	if l == nil {
		w.Header().Set("X-RateLimit-Limit", "5")
		w.Header().Set("X-RateLimit-Remaining", "4")
		w.Header().Set("X-RateLimit-Reset-After", "1")
		w.Header().Set("X-RateLimit-Bucket", "fakebucket")
		return false
	}
	if l.Exhaust {
		w.Header().Set("X-RateLimit-Limit", "5")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", strconv.FormatFloat(l.ResetAfter, 'f', 3, 64))
		w.Header().Set("X-RateLimit-Bucket", "fakebucket")
		return false
	}
	// rate-limits.mdx: Retry-After in seconds, retry_after in the body.
	w.Header().Set("Retry-After", strconv.Itoa(int(l.RetryAfter+0.999)))
	if l.Global {
		w.Header().Set("X-RateLimit-Global", "true")
		w.Header().Set("X-RateLimit-Scope", "global")
	} else {
		w.Header().Set("X-RateLimit-Limit", "5")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", strconv.FormatFloat(l.RetryAfter, 'f', 3, 64))
		w.Header().Set("X-RateLimit-Scope", "user")
	}
	reply(w, http.StatusTooManyRequests, map[string]any{"message": "You are being rate limited.", "retry_after": l.RetryAfter, "global": l.Global})
	return true
}

func (s *Server) refused(w http.ResponseWriter, key string) bool {
	s.mu.Lock()
	ref, ok := s.refusals[key]
	s.mu.Unlock()
	if ok {
		reply(w, ref.Status, map[string]any{"message": ref.Message, "code": ref.Code})
	}
	return ok
}

type messageBody struct {
	Content          string          `json:"content"`
	Nonce            json.RawMessage `json:"nonce"` // an integer or a string
	EnforceNonce     bool            `json:"enforce_nonce"`
	AllowedMentions  json.RawMessage `json:"allowed_mentions"`
	MessageReference *struct {
		MessageID string `json:"message_id"`
	} `json:"message_reference"`
	Attachments []struct {
		ID          json.Number `json:"id"`
		Filename    string      `json:"filename"`
		Description string      `json:"description"`
	} `json:"attachments"`
	Components json.RawMessage `json:"components"`
	files      []File          // from the files[n] parts (files.go)
	rows       []Row           // Components, checked (components.go)
}

func (s *Server) readMessage(w http.ResponseWriter, r *http.Request) (messageBody, bool) {
	var b messageBody
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		if !readMultipart(w, r, &b) {
			return b, false
		}
	} else if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b); err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"message": "400: Bad Request", "code": 50109})
		return b, false
	}
	rows, ok := readComponents(w, b.Components)
	if !ok {
		return b, false
	}
	b.rows = rows
	if b.Content == "" && len(b.files) == 0 && len(b.rows) == 0 {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Cannot send an empty message", "code": 50006})
		return b, false
	}
	if n := len([]rune(b.Content)); n > 2000 {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035,
			"errors": map[string]any{"content": map[string]any{"_errors": []any{map[string]any{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}}}}})
		return b, false
	}
	return b, true
}

func (s *Server) channelMessage(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	s.mu.Lock()
	s.postRequests++
	s.notify()
	s.mu.Unlock()
	ch := r.PathValue("channel")
	if s.refused(w, ch) || s.limited(w) {
		return
	}
	b, ok := s.readMessage(w, r)
	if !ok {
		return
	}
	nonce, ok := readNonce(w, b.Nonce)
	if !ok {
		return
	}
	p := Post{Channel: ch, Content: b.Content, Mentions: b.AllowedMentions, Authority: r.Header.Get("Authorization"), Nonce: nonce, EnforceNonce: b.EnforceNonce, Files: b.files, Components: b.rows}
	if b.MessageReference != nil {
		p.ReplyTo = b.MessageReference.MessageID
	}
	// resources/message.mdx, Create Message: with enforce_nonce, a nonce the
	// same author used in the past few minutes returns that message and
	// creates none.
	key := p.Authority + "\x00" + nonce
	s.mu.Lock()
	if prior, ok := s.nonces[key]; ok && b.EnforceNonce && nonce != "" && time.Since(prior.at) < s.nonceWindow {
		s.mu.Unlock()
		s.answerMessage(w, r, prior.message)
		return
	}
	s.mu.Unlock()
	id := s.addPost(p)
	msg := map[string]any{"id": id, "channel_id": ch, "content": b.Content, "type": 0}
	if nonce != "" {
		msg["nonce"] = nonce
	}
	if b.EnforceNonce && nonce != "" {
		s.mu.Lock()
		s.nonces[key] = sentNonce{message: msg, at: time.Now()}
		s.mu.Unlock()
	}
	s.answerMessage(w, r, msg)
}

// readNonce reads a message's nonce (an integer or a string of at most 25
// characters); false when it answered 400.
func readNonce(w http.ResponseWriter, raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	var str string
	if json.Unmarshal(raw, &str) != nil {
		var n json.Number
		if json.Unmarshal(raw, &n) != nil {
			reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035})
			return "", false
		}
		str = n.String()
	}
	if len(str) > 25 {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035,
			"errors": map[string]any{"nonce": map[string]any{"_errors": []any{map[string]any{"code": "BASE_TYPE_BAD_LENGTH", "message": "Must be between 1 and 25 in length."}}}}})
		return "", false
	}
	return str, true
}

// answerMessage answers a created (or an existing) message, unless the test
// asked to lose the answer: the message stands and the client sees its
// connection cut, as after a crash or a network failure between the two.
func (s *Server) answerMessage(w http.ResponseWriter, r *http.Request, msg map[string]any) {
	s.mu.Lock()
	lose := s.loseResponses > 0
	if lose {
		s.loseResponses--
	}
	s.mu.Unlock()
	if lose {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	reply(w, http.StatusOK, msg)
}

// LoseNextResponses makes the next n message posts create their message and
// then cut the connection instead of answering.
func (s *Server) LoseNextResponses(n int) { s.mu.Lock(); s.loseResponses += n; s.mu.Unlock() }

// PostRequests counts the POSTs to channel messages, answered or not.
func (s *Server) PostRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.postRequests
}

// getChannel answers GET /channels/{id} for the channels and threads
// GuildCreate listed.
func (s *Server) getChannel(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	s.mu.Lock()
	ch, ok := s.channels[r.PathValue("channel")]
	s.mu.Unlock()
	if !ok {
		reply(w, http.StatusNotFound, map[string]any{"message": "Unknown Channel", "code": 10003})
		return
	}
	reply(w, http.StatusOK, ch)
}

func (s *Server) followup(w http.ResponseWriter, r *http.Request) {
	app := r.PathValue("app")
	if s.refused(w, app) || s.limited(w) {
		return
	}
	if app != s.AppID {
		reply(w, http.StatusNotFound, map[string]any{"message": "Unknown Webhook", "code": 10015})
		return
	}
	b, ok := s.readMessage(w, r)
	if !ok {
		return
	}
	id := s.addPost(Post{Webhook: app + "/" + r.PathValue("token"), Content: b.Content, Mentions: b.AllowedMentions, Authority: r.Header.Get("Authorization"), Files: b.files, Components: b.rows})
	reply(w, http.StatusOK, map[string]any{"id": id, "content": b.Content, "type": 0, "webhook_id": app})
}

func (s *Server) channelTyping(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	s.mu.Lock()
	s.typing = append(s.typing, r.PathValue("channel"))
	s.notify()
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) addPost(p Post) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.ID = strconv.Itoa(900000000000000000 + len(s.posts) + 1)
	s.posts = append(s.posts, p)
	s.notify()
	return p.ID
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
