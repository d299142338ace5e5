// Package meepachattest is an in-process fake of a MeepaChat instance for
// tests: the bot gateway WebSocket (GET /api/bot-gateway) and the two REST
// endpoints a bot posts replies to, speaking the wire protocol MeepaChat
// documents for bots (frames of {"type","data"}, a ready event with the bot
// user, its servers and channels and its DM channels, subscribe, typing,
// ping/pong, message.created; replies answered with {data, error}). It holds
// the gateway's 4,096-byte limit on what a bot sends, delivers events only to
// connections subscribed to their channel, and lets a test drop connections,
// go silent, answer 429 with Retry-After, refuse a channel, fail a handshake
// or send garbage, so connectors can be driven through every path. It also
// takes uploads as MeepaChat's bot clients make them (files.go).
package meepachattest

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
)

// MaxFrame is the gateway's limit on a frame a bot sends (bytes).
const MaxFrame = 4096

// MaxContent is the longest message content the REST API accepts (characters).
const MaxContent = 4000

// User is a MeepaChat user as the API shows it.
type User struct {
	ID          string `json:"id"`
	Username    string `json:"username"`
	DisplayName string `json:"displayName"`
	Status      string `json:"status"`
	Bot         bool   `json:"bot"`
	CreatedAt   string `json:"createdAt"`
}

// Channel is a server channel or a DM channel.
type Channel struct {
	ID          string  `json:"id"`
	ServerID    *string `json:"serverId"`
	Name        string  `json:"name"`
	DisplayName string  `json:"displayName"`
	Topic       *string `json:"topic"`
	IsDM        bool    `json:"isDm"`
	IsPrivate   bool    `json:"isPrivate"`
}

// Server is a MeepaChat server with the channels the bot was added to.
type Server struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	Channels []Channel `json:"channels"`
}

// Mention is one user mentioned in a message.
type Mention struct {
	ID       string `json:"id"`
	Username string `json:"username,omitempty"`
}

// Message is a message as message.created carries it and the REST API
// returns it.
type Message struct {
	ID        string    `json:"id"`
	ChannelID string    `json:"channelId"`
	UserID    string    `json:"userId"`
	ThreadID  string    `json:"threadId,omitempty"`
	Content   string    `json:"content"`
	Edited    bool      `json:"edited"`
	CreatedAt string    `json:"createdAt"`
	UpdatedAt string    `json:"updatedAt"`
	User      *User     `json:"user,omitempty"`
	Mentions  []Mention `json:"mentions,omitempty"`
	// Attachments are the message's files (Store makes them).
	Attachments []StoredFile `json:"attachments,omitempty"`
}

// Frame is one gateway frame.
type Frame struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// Posted is a message a bot posted through the REST API.
type Posted struct {
	ServerID  string // empty for a DM
	ChannelID string
	ThreadID  string
	Content   string
	DM        bool
	// Attachments are the uploads the message named (files.go).
	Attachments []Attachment
}

// Options configure a fake instance.
type Options struct {
	// Token is the bot token the fake accepts: "<bot_id>.<secret>".
	Token      string
	Bot        User
	Servers    []Server
	DMChannels []Channel
	// TLS serves HTTPS with a certificate trusted only through CAFile.
	TLS bool
	// PingEvery, when set, pings each connection at this interval (the real
	// gateway: 30 s) and drops one that does not answer within 60 s.
	PingEvery time.Duration
}

// Fake is a running fake MeepaChat instance.
type Fake struct {
	URL string // http(s)://127.0.0.1:port

	srv  *httptest.Server
	opts Options

	mu         sync.Mutex
	servers    []Server
	dms        []Channel
	conns      []*gwConn
	posted     []Posted
	typing     []string
	attempts   int            // posts received
	limitAt    map[int]string // post number → Retry-After of its 429
	refused    map[string]int
	failShakes []int // statuses for the next gateway requests
	closeEarly int   // next upgrades closed before ready
	noReady    int   // next upgrades that get no ready event
	silent     bool
	nextID     int
	changed    chan struct{}
	reactions  []Reaction         // progress.go
	uploads    map[string]*upload // files.go
	stored     map[string][]byte  // stored.go: storedPath → bytes
	downloads  int
}

type gwConn struct {
	c          *websocket.Conn
	subscribed map[string]bool
	frames     []Frame
	closed     bool
	cancel     context.CancelFunc
}

// New starts a fake; Close stops it.
func New(o Options) *Fake {
	f := &Fake{opts: o, servers: o.Servers, dms: o.DMChannels, refused: map[string]int{}, limitAt: map[int]string{}, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/bot-gateway", f.gateway)
	mux.HandleFunc("POST /api/servers/{server}/channels/{channel}/messages", f.post)
	mux.HandleFunc("POST /api/dms/{channel}/messages", f.post)
	f.handleReactions(mux)
	f.handleFiles(mux)
	mux.HandleFunc("GET /uploads/{id}/{name}", f.storedFile)
	f.srv = httptest.NewUnstartedServer(mux)
	// Refused handshakes (an untrusted certificate) are what tests provoke.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if o.TLS {
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	f.URL = f.srv.URL
	return f
}

// Close drops every connection and stops the server.
func (f *Fake) Close() {
	f.DropConnections()
	f.srv.CloseClientConnections()
	f.srv.Close()
}

// WriteCAFile writes the fake's TLS certificate as a PEM CA file in dir and
// returns its path (TLS fakes only).
func (f *Fake) WriteCAFile(dir string) (string, error) {
	cert := f.srv.Certificate()
	if cert == nil {
		return "", errors.New("the fake serves no TLS")
	}
	p := filepath.Join(dir, "meepachat-ca.pem")
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("cannot write CA file: %w", err)
	}
	return p, nil
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// wait blocks until cond (called with f.mu held) is true or ctx ends.
func (f *Fake) wait(ctx context.Context, what string, cond func() bool) error {
	for {
		f.mu.Lock()
		ok := cond()
		ch := f.changed
		f.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("fake meepachat: gave up waiting for %s: %w", what, ctx.Err())
		}
	}
}

func (f *Fake) authorized(r *http.Request) bool {
	return r.Header.Get("Authorization") == "Bot "+f.opts.Token
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type envelope struct {
	Data  any    `json:"data"`
	Error string `json:"error,omitempty"`
}

func (f *Fake) gateway(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	status := 0
	if len(f.failShakes) > 0 {
		status, f.failShakes = f.failShakes[0], f.failShakes[1:]
	}
	closeEarly := f.closeEarly > 0
	if closeEarly {
		f.closeEarly--
	}
	noReady := f.noReady > 0
	if noReady {
		f.noReady--
	}
	f.mu.Unlock()
	if status != 0 {
		writeJSON(w, status, envelope{Error: http.StatusText(status)})
		return
	}
	if !f.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, envelope{Error: "invalid bot token"})
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	c.SetReadLimit(MaxFrame)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	gc := &gwConn{c: c, subscribed: map[string]bool{}, cancel: cancel}
	f.mu.Lock()
	f.conns = append(f.conns, gc)
	f.notifyLocked()
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		gc.closed = true
		f.notifyLocked()
		f.mu.Unlock()
		c.CloseNow()
	}()
	if closeEarly {
		c.CloseNow()
		return
	}
	if f.opts.PingEvery > 0 {
		go f.pinger(ctx, gc)
	}
	if !noReady {
		if err := f.writeFrame(ctx, gc, "ready", f.readyData()); err != nil {
			return
		}
	}
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			continue
		}
		var fr Frame
		if err := json.Unmarshal(data, &fr); err != nil {
			_ = c.Close(websocket.StatusUnsupportedData, "malformed frame")
			return
		}
		f.mu.Lock()
		gc.frames = append(gc.frames, fr)
		silent := f.silent
		switch fr.Type {
		case "subscribe":
			var d struct {
				ChannelIDs []string `json:"channelIds"`
			}
			if json.Unmarshal(fr.Data, &d) == nil {
				for _, id := range d.ChannelIDs {
					gc.subscribed[id] = true
				}
			}
		case "typing":
			var d struct {
				ChannelID string `json:"channelId"`
			}
			if json.Unmarshal(fr.Data, &d) == nil {
				f.typing = append(f.typing, d.ChannelID)
			}
		}
		f.notifyLocked()
		f.mu.Unlock()
		if fr.Type == "ping" && !silent {
			if err := f.writeFrame(ctx, gc, "pong", nil); err != nil {
				return
			}
		}
	}
}

// pinger pings like the real gateway and drops a bot that stops answering.
func (f *Fake) pinger(ctx context.Context, gc *gwConn) {
	t := time.NewTicker(f.opts.PingEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := gc.c.Ping(pctx)
		cancel()
		if err != nil {
			gc.c.CloseNow()
			return
		}
	}
}

func (f *Fake) readyData() any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return map[string]any{"user": f.opts.Bot, "servers": f.servers, "dmChannels": f.dms}
}

func (f *Fake) writeFrame(ctx context.Context, gc *gwConn, typ string, data any) error {
	fr := map[string]any{"type": typ}
	if data != nil {
		fr["data"] = data
	}
	b, err := json.Marshal(fr)
	if err != nil {
		return err
	}
	return f.writeRaw(ctx, gc, b)
}

func (f *Fake) writeRaw(ctx context.Context, gc *gwConn, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // the gateway's write deadline
	defer cancel()
	return gc.c.Write(ctx, websocket.MessageText, b)
}

// open returns the connections that are still open.
func (f *Fake) open() []*gwConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*gwConn
	for _, gc := range f.conns {
		if !gc.closed {
			out = append(out, gc)
		}
	}
	return out
}

// Deliver sends message.created for m to every open connection subscribed to
// its channel, as the gateway does; it returns how many got it. Deliver the
// same m twice to redeliver it.
func (f *Fake) Deliver(ctx context.Context, m Message) (int, error) {
	if m.CreatedAt == "" {
		m.CreatedAt = time.Now().UTC().Format(time.RFC3339Nano)
		m.UpdatedAt = m.CreatedAt
	}
	n := 0
	for _, gc := range f.open() {
		f.mu.Lock()
		sub := gc.subscribed[m.ChannelID]
		f.mu.Unlock()
		if !sub {
			continue
		}
		if err := f.writeFrame(ctx, gc, "message.created", m); err != nil {
			return n, fmt.Errorf("cannot deliver message %s: %w", m.ID, err)
		}
		n++
	}
	return n, nil
}

// SendEvent sends a frame of the given type and data to every open connection.
func (f *Fake) SendEvent(ctx context.Context, typ string, data any) error {
	for _, gc := range f.open() {
		if err := f.writeFrame(ctx, gc, typ, data); err != nil {
			return fmt.Errorf("cannot send %s: %w", typ, err)
		}
	}
	return nil
}

// SendRaw sends b as one text frame to every open connection, whatever it is.
func (f *Fake) SendRaw(ctx context.Context, b []byte) error {
	for _, gc := range f.open() {
		if err := f.writeRaw(ctx, gc, b); err != nil {
			return fmt.Errorf("cannot send raw frame: %w", err)
		}
	}
	return nil
}

// AddChannel adds a channel to a server and announces it with channel.created.
func (f *Fake) AddChannel(ctx context.Context, serverID string, ch Channel) error {
	ch.ServerID = &serverID
	f.mu.Lock()
	for i := range f.servers {
		if f.servers[i].ID == serverID {
			f.servers[i].Channels = append(f.servers[i].Channels, ch)
		}
	}
	f.mu.Unlock()
	return f.SendEvent(ctx, "channel.created", ch)
}

// AddServer adds the bot to a server and announces it with server.added.
func (f *Fake) AddServer(ctx context.Context, s Server) error {
	f.mu.Lock()
	f.servers = append(f.servers, s)
	f.mu.Unlock()
	return f.SendEvent(ctx, "server.added", s)
}

// Ping sends a WebSocket ping to every open connection and waits for the
// pongs, as the gateway does every 30 seconds.
func (f *Fake) Ping(ctx context.Context) error {
	for _, gc := range f.open() {
		if err := gc.c.Ping(ctx); err != nil {
			return fmt.Errorf("ping not answered: %w", err)
		}
	}
	return nil
}

// SetSilent makes the gateway stop answering the bot's ping frames.
func (f *Fake) SetSilent(silent bool) {
	f.mu.Lock()
	f.silent = silent
	f.mu.Unlock()
}

// DropConnections closes every open connection abruptly (no close frame).
func (f *Fake) DropConnections() {
	for _, gc := range f.open() {
		gc.c.CloseNow()
		gc.cancel()
	}
}

// FailHandshakes answers the next gateway requests with these HTTP statuses
// instead of upgrading.
func (f *Fake) FailHandshakes(statuses ...int) {
	f.mu.Lock()
	f.failShakes = append(f.failShakes, statuses...)
	f.mu.Unlock()
}

// CloseBeforeReady closes the next n connections right after the upgrade,
// before the ready event.
func (f *Fake) CloseBeforeReady(n int) {
	f.mu.Lock()
	f.closeEarly += n
	f.mu.Unlock()
}

// WithholdReady keeps the next n connections open without a ready event.
func (f *Fake) WithholdReady(n int) {
	f.mu.Lock()
	f.noReady += n
	f.mu.Unlock()
}

// RateLimit answers the next posts 429 with these Retry-After values, one
// each.
func (f *Fake) RateLimit(retryAfter ...string) {
	f.mu.Lock()
	for i, ra := range retryAfter {
		f.limitAt[f.attempts+1+i] = ra
	}
	f.mu.Unlock()
}

// RateLimitAt answers the n-th post from now (1: the next) 429 with
// Retry-After retryAfter.
func (f *Fake) RateLimitAt(n int, retryAfter string) {
	f.mu.Lock()
	f.limitAt[f.attempts+n] = retryAfter
	f.mu.Unlock()
}

// Refuse answers every post to channel with status (403: bot removed, 404:
// channel gone).
func (f *Fake) Refuse(channel string, status int) {
	f.mu.Lock()
	f.refused[channel] = status
	f.mu.Unlock()
}

// Connections is how many gateway connections were upgraded so far.
func (f *Fake) Connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// WaitConnections waits until n connections were upgraded and the n-th
// subscribed to want channels (none: only connected).
func (f *Fake) WaitConnections(ctx context.Context, n int, want ...string) error {
	return f.wait(ctx, fmt.Sprintf("connection %d subscribed to %v", n, want), func() bool {
		if len(f.conns) < n {
			return false
		}
		gc := f.conns[n-1]
		for _, id := range want {
			if !gc.subscribed[id] {
				return false
			}
		}
		return true
	})
}

// WaitClosed waits until connection n (1-based) is closed.
func (f *Fake) WaitClosed(ctx context.Context, n int) error {
	return f.wait(ctx, fmt.Sprintf("connection %d closed", n), func() bool {
		return len(f.conns) >= n && f.conns[n-1].closed
	})
}

// Frames returns the frames connection n (1-based) sent.
func (f *Fake) Frames(n int) []Frame {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n < 1 || n > len(f.conns) {
		return nil
	}
	return append([]Frame(nil), f.conns[n-1].frames...)
}

// WaitFrame waits until connection n sent a frame of type typ and returns it.
func (f *Fake) WaitFrame(ctx context.Context, n int, typ string) (Frame, error) {
	var got Frame
	err := f.wait(ctx, fmt.Sprintf("a %s frame on connection %d", typ, n), func() bool {
		if n < 1 || n > len(f.conns) {
			return false
		}
		for _, fr := range f.conns[n-1].frames {
			if fr.Type == typ {
				got = fr
				return true
			}
		}
		return false
	})
	return got, err
}

// Typing returns the channels the bot sent typing for.
func (f *Fake) Typing() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.typing...)
}

// Posted returns the messages posted so far, in order.
func (f *Fake) Posted() []Posted {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Posted(nil), f.posted...)
}

// WaitPosted waits until n messages were posted.
func (f *Fake) WaitPosted(ctx context.Context, n int) ([]Posted, error) {
	err := f.wait(ctx, fmt.Sprintf("%d posted messages", n), func() bool { return len(f.posted) >= n })
	return f.Posted(), err
}

func (f *Fake) knownChannel(server, channel string, dm bool) bool {
	if dm {
		for _, c := range f.dms {
			if c.ID == channel {
				return true
			}
		}
		return false
	}
	for _, s := range f.servers {
		if s.ID != server {
			continue
		}
		for _, c := range s.Channels {
			if c.ID == channel {
				return true
			}
		}
	}
	return false
}

func (f *Fake) post(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, envelope{Error: "invalid bot token"})
		return
	}
	server, channel := r.PathValue("server"), r.PathValue("channel")
	dm := strings.HasPrefix(r.URL.Path, "/api/dms/")
	var body struct {
		Content       *string  `json:"content"`
		ThreadID      string   `json:"threadId"`
		AttachmentIDs []string `json:"attachmentIds"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&body); err != nil || body.Content == nil {
		writeJSON(w, http.StatusBadRequest, envelope{Error: "invalid request body"})
		return
	}
	if n := utf8.RuneCountInString(*body.Content); n == 0 || n > MaxContent {
		writeJSON(w, http.StatusBadRequest, envelope{Error: "content must be 1 to " + strconv.Itoa(MaxContent) + " characters"})
		return
	}
	f.mu.Lock()
	f.attempts++
	if ra, ok := f.limitAt[f.attempts]; ok {
		delete(f.limitAt, f.attempts)
		f.mu.Unlock()
		w.Header().Set("Retry-After", ra)
		writeJSON(w, http.StatusTooManyRequests, envelope{Error: "rate limited"})
		return
	}
	if st, ok := f.refused[channel]; ok {
		f.mu.Unlock()
		msg := "channel not found"
		if st == http.StatusForbidden {
			msg = "bot is not a member of this channel"
		}
		writeJSON(w, st, envelope{Error: msg})
		return
	}
	if !f.knownChannel(server, channel, dm) {
		f.mu.Unlock()
		writeJSON(w, http.StatusNotFound, envelope{Error: "channel not found"})
		return
	}
	attachments, ok := f.takeAttachmentsLocked(body.AttachmentIDs)
	if !ok {
		f.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, envelope{Error: "unknown attachment"})
		return
	}
	f.nextID++
	m := Message{
		ID: fmt.Sprintf("posted-%d", f.nextID), ChannelID: channel, UserID: f.opts.Bot.ID,
		ThreadID: body.ThreadID, Content: *body.Content, User: &f.opts.Bot,
		CreatedAt: time.Now().UTC().Format(time.RFC3339Nano),
	}
	f.posted = append(f.posted, Posted{ServerID: server, ChannelID: channel, ThreadID: body.ThreadID, Content: *body.Content, DM: dm, Attachments: attachments})
	f.notifyLocked()
	f.mu.Unlock()
	writeJSON(w, http.StatusCreated, envelope{Data: m})
}
