package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/coder/websocket"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Gateway opcodes (opcodes-and-status-codes.mdx).
const (
	opDispatch       = 0
	opHeartbeat      = 1
	opIdentify       = 2
	opResume         = 6
	opReconnect      = 7
	opInvalidSession = 9
	opHello          = 10
	opHeartbeatACK   = 11
)

// closeResumable is the close code used when berth drops a connection on
// purpose: anything but 1000/1001 keeps the session resumable.
const closeResumable websocket.StatusCode = 4000

// Intents asks for what berth reads: guild channels (names, threads), guild
// and DM messages, and their content.
const Intents = discordgo.IntentsGuilds | discordgo.IntentsGuildMessages |
	discordgo.IntentsDirectMessages | discordgo.IntentsMessageContent

type payload struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s"`
	T  string          `json:"t"`
}

// session is what a RESUME needs; it lives in Run's goroutine, seq is also
// read by the heartbeat.
type session struct {
	id        string
	resumeURL string
	selfID    string
	seq       atomic.Int64   // last event handled (for messages: accepted)
	keeper    *sessionKeeper // nil: the session is not kept across restarts
}

func (s *session) reset() {
	s.id, s.resumeURL = "", ""
	s.seq.Store(0)
	s.checkpoint()
}

// checkpoint hands the session to the keeper, which stores it in the
// background.
func (s *session) checkpoint() {
	if s.keeper != nil {
		s.keeper.note(keptSession{ID: s.id, ResumeURL: s.resumeURL, Seq: s.seq.Load(), SelfID: s.selfID})
	}
}

func (s *session) restore(k keptSession) {
	s.id, s.resumeURL, s.selfID = k.ID, k.ResumeURL, k.SelfID
	s.seq.Store(k.Seq)
}

// connResult is how one connection ended.
type connResult struct {
	established bool // reached READY or RESUMED
	fatal       bool // a close code reconnecting cannot fix
	invalid     bool // INVALID_SESSION: wait 1–5 s before the next IDENTIFY
	err         error
}

// Run holds the Gateway connection until ctx ends, reconnecting with capped
// exponential back-off and jitter and resuming the session where Discord
// allows it. Without a bot token it returns nil at once.
func (c *Connector) Run(ctx context.Context, sink connector.Sink) error {
	if c.o.BotToken == "" {
		return nil
	}
	defer c.status.Stopped()
	var sess session
	if store, ok := sink.(SessionStore); ok {
		sess.keeper = newSessionKeeper(store, c.id, c.log)
		if kept := sess.keeper.load(); kept.ID != "" {
			sess.restore(kept)
			c.log.Info("resuming the discord gateway session kept from before the restart", "seq", kept.Seq)
		}
		go sess.keeper.run()
		defer sess.keeper.close()
	}
	failures := 0
	for {
		c.status.Connecting()
		res := c.connect(ctx, sink, &sess)
		if ctx.Err() != nil {
			return nil
		}
		if res.established {
			failures = 0
		}
		failures++
		delay := c.backoff(failures)
		switch {
		case res.fatal:
			delay = c.o.BackoffMax
		case res.invalid:
			// gateway-events.mdx, Invalid Session: wait a random 1–5 s.
			delay = max(delay, min(c.o.BackoffMax, time.Second+time.Duration(rand.Int64N(int64(4*time.Second)))))
		}
		msg := "gateway connection ended"
		if res.err != nil {
			msg = c.redact(res.err.Error())
		}
		c.status.Disconnected(errors.New(msg), c.clock.Now())
		c.log.Warn("discord gateway disconnected; reconnecting", "error", msg, "resume", sess.id != "", "in", delay.String())
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(delay):
		}
	}
}

// backoff is the wait before reconnect attempt n (1-based): exponential from
// BackoffMin, capped at BackoffMax, with the upper half jittered.
func (c *Connector) backoff(n int) time.Duration {
	return backoff.Policy{Min: c.o.BackoffMin, Max: c.o.BackoffMax, Jitter: 0.5}.Delay(n)
}

func (c *Connector) connect(ctx context.Context, sink connector.Sink, sess *session) (res connResult) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	target := sess.resumeURL
	if sess.id == "" || target == "" {
		gw, err := c.gatewayURL(ctx)
		if connector.IsPermanent(err) {
			warn := "the bot token was rejected: " + c.redact(err.Error())
			c.status.Warn(warn)
			return connResult{err: err, fatal: true}
		}
		if err != nil {
			return connResult{err: err}
		}
		target = gw
	}
	dialCtx, dialCancel := context.WithTimeout(ctx, c.o.HandshakeTimeout)
	conn, _, err := websocket.Dial(dialCtx, withGatewayQuery(target), &websocket.DialOptions{HTTPClient: c.http})
	dialCancel()
	if err != nil {
		// The next attempt goes to the gateway URL (gateway.mdx, Handling a
		// Disconnect: "or the reconnect fails").
		if target == sess.resumeURL {
			sess.resumeURL = ""
		} else {
			c.forgetGatewayURL()
		}
		return connResult{err: fmt.Errorf("cannot connect to the gateway: %w", err)}
	}
	defer conn.CloseNow()
	conn.SetReadLimit(c.o.MaxFrameBytes)

	// A gateway that never finishes the handshake is dropped.
	var ready atomic.Bool
	handshake := c.clock.AfterFunc(c.o.HandshakeTimeout, func() {
		if !ready.Load() {
			c.log.Warn("discord gateway handshake timed out", "after", c.o.HandshakeTimeout.String())
			conn.CloseNow()
		}
	})
	defer handshake.Stop()

	hello, err := c.read(ctx, conn)
	if err != nil {
		return c.readFailure(err, sess, false)
	}
	if hello == nil || hello.Op != opHello {
		return connResult{err: errors.New("gateway handshake: the first frame is not HELLO (op 10)")}
	}
	var h struct {
		Interval int64 `json:"heartbeat_interval"`
	}
	if err := json.Unmarshal(hello.D, &h); err != nil || h.Interval <= 0 {
		return connResult{err: errors.New("gateway handshake: HELLO without a heartbeat_interval")}
	}

	if sess.id != "" {
		err = c.write(ctx, conn, map[string]any{"op": opResume, "d": map[string]any{
			"token": c.o.BotToken, "session_id": sess.id, "seq": sess.seq.Load(),
		}})
	} else {
		err = c.write(ctx, conn, map[string]any{"op": opIdentify, "d": map[string]any{
			"token":      c.o.BotToken,
			"intents":    Intents,
			"properties": map[string]string{"os": "linux", "browser": "berth", "device": "berth"},
		}})
	}
	if err != nil {
		return connResult{err: fmt.Errorf("cannot send %s: %w", map[bool]string{true: "RESUME", false: "IDENTIFY"}[sess.id != ""], err)}
	}

	var acked atomic.Bool
	acked.Store(true)
	go c.heartbeat(ctx, conn, time.Duration(h.Interval)*time.Millisecond, sess, &acked)

	for {
		p, err := c.read(ctx, conn)
		if err != nil {
			res = c.readFailure(err, sess, ready.Load())
			res.established = ready.Load()
			return res
		}
		if p == nil {
			continue // logged by read
		}
		switch p.Op {
		case opDispatch:
			// The gateway took IDENTIFY or RESUME; a long replay may outlast
			// the handshake deadline.
			handshake.Stop()
			c.noteEvent()
			if p.S != nil && p.T != "MESSAGE_CREATE" {
				sess.seq.Store(*p.S) // only a message waits for the sink
			}
			if err := c.dispatch(ctx, sink, sess, p, &ready); err != nil {
				// Not acknowledged: the RESUME asks for it again.
				conn.Close(closeResumable, "resuming")
				return connResult{established: ready.Load(), err: err}
			}
			if p.S != nil {
				sess.seq.Store(*p.S)
			}
			sess.checkpoint()
		case opHeartbeat:
			if err := c.sendHeartbeat(ctx, conn, sess); err != nil {
				return connResult{established: ready.Load(), err: err}
			}
		case opHeartbeatACK:
			acked.Store(true)
		case opReconnect:
			c.log.Info("discord gateway asked to reconnect (op 7); resuming")
			conn.Close(closeResumable, "reconnect requested")
			return connResult{established: ready.Load(), err: errors.New("the gateway asked to reconnect (op 7)")}
		case opInvalidSession:
			var resumable bool
			_ = json.Unmarshal(p.D, &resumable)
			if !resumable {
				sess.reset()
			}
			conn.Close(closeResumable, "invalid session")
			return connResult{established: ready.Load(), invalid: true, err: fmt.Errorf("the gateway invalidated the session (op 9, resumable %t)", resumable)}
		case opHello:
		default:
			c.log.Warn("discord gateway sent an unknown opcode; ignored", "op", p.Op)
		}
	}
}

// dispatch handles one op-0 event; an error means it was not accepted.
func (c *Connector) dispatch(ctx context.Context, sink connector.Sink, sess *session, p *payload, ready *atomic.Bool) error {
	switch p.T {
	case "READY":
		var r struct {
			SessionID string         `json:"session_id"`
			ResumeURL string         `json:"resume_gateway_url"`
			User      discordgo.User `json:"user"`
		}
		if err := json.Unmarshal(p.D, &r); err != nil || r.SessionID == "" || r.User.ID == "" {
			c.log.Warn("discord gateway sent a malformed READY; ignored")
			return nil
		}
		sess.id, sess.resumeURL, sess.selfID = r.SessionID, r.ResumeURL, r.User.ID
		c.connected(ready)
		c.log.Info("connected to the discord gateway", "bot_user", r.User.ID)
	case "RESUMED":
		c.connected(ready)
		c.log.Info("resumed the discord gateway session")
	case "MESSAGE_CREATE":
		return c.onMessage(ctx, sink, p.D, sess.selfID)
	case "INTERACTION_CREATE":
		c.onInteraction(ctx, sink, p.D)
	case "GUILD_CREATE":
		var g discordgo.Guild
		if err := json.Unmarshal(p.D, &g); err != nil {
			c.log.Warn("discord gateway sent a malformed GUILD_CREATE; ignored")
			return nil
		}
		c.rememberChannels(append(g.Channels, g.Threads...)...)
	case "CHANNEL_CREATE", "CHANNEL_UPDATE", "THREAD_CREATE", "THREAD_UPDATE":
		var ch discordgo.Channel
		if err := json.Unmarshal(p.D, &ch); err == nil {
			c.rememberChannels(&ch)
		}
	case "CHANNEL_DELETE", "THREAD_DELETE":
		var ch discordgo.Channel
		if err := json.Unmarshal(p.D, &ch); err == nil {
			c.forgetChannel(ch.ID)
		}
	default:
		c.log.Debug("discord gateway event ignored", "event", p.T)
	}
	return nil
}

func (c *Connector) connected(ready *atomic.Bool) {
	ready.Store(true)
	c.status.Connected(c.clock.Now())
	// A refusal of the bot is over once it connects. Cleared by its own text
	// (never "", which clears any): a ContentWarning set meanwhile stays.
	if w := c.status.Snapshot().Warning; w != "" && w != ContentWarning {
		c.status.ClearWarning(w)
	}
}

// read returns the next frame; nil (with a log line) for a frame that is not
// a gateway payload, an error when the connection is gone.
func (c *Connector) read(ctx context.Context, conn *websocket.Conn) (*payload, error) {
	typ, data, err := conn.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		c.log.Warn("discord gateway sent a binary frame (compression was not asked for); ignored", "bytes", len(data))
		return nil, nil
	}
	var p payload
	if err := json.Unmarshal(data, &p); err != nil {
		c.log.Warn("discord gateway sent a frame that is not a JSON payload; ignored", "bytes", len(data), "error", err)
		return nil, nil
	}
	return &p, nil
}

// readFailure classifies how the connection ended (close codes in
// opcodes-and-status-codes.mdx).
func (c *Connector) readFailure(err error, sess *session, established bool) connResult {
	code := websocket.CloseStatus(err)
	res := connResult{established: established}
	warn := ""
	switch code {
	case 4004:
		warn = "the bot token was rejected (gateway close 4004): check bot_token"
	case 4010, 4011:
		warn = fmt.Sprintf("the gateway requires sharding (close %d); berth runs one shard", code)
	case 4012:
		warn = "the gateway refused API version 10 (close 4012)"
	case 4013:
		warn = "the gateway refused the intents (close 4013)"
	case 4014:
		warn = "the bot is not allowed the MESSAGE_CONTENT intent (gateway close 4014): enable MESSAGE CONTENT INTENT under Bot → Privileged Gateway Intents in the Developer Portal"
	case 4007, 4009:
		sess.reset()
	}
	if warn != "" {
		res.fatal = true
		sess.reset()
		c.log.Error("discord gateway refused the bot", "error", warn)
		c.status.Warn(warn)
		res.err = errors.New(warn)
		return res
	}
	switch {
	case code >= 0:
		res.err = fmt.Errorf("the gateway closed the connection with code %d", code)
	case errors.Is(err, context.Canceled):
		res.err = err
	default:
		res.err = fmt.Errorf("gateway connection lost: %w", err)
	}
	return res
}

func (c *Connector) heartbeat(ctx context.Context, conn *websocket.Conn, interval time.Duration, sess *session, acked *atomic.Bool) {
	t := c.clock.NewTimer(time.Duration(rand.Int64N(int64(interval)) + 1))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if !acked.Swap(false) {
			c.log.Warn("discord gateway did not acknowledge the last heartbeat; reconnecting")
			conn.CloseNow()
			return
		}
		if err := c.sendHeartbeat(ctx, conn, sess); err != nil {
			return
		}
		t.Reset(interval)
	}
}

func (c *Connector) sendHeartbeat(ctx context.Context, conn *websocket.Conn, sess *session) error {
	var d any
	if s := sess.seq.Load(); s > 0 {
		d = s
	}
	if err := c.write(ctx, conn, map[string]any{"op": opHeartbeat, "d": d}); err != nil {
		return fmt.Errorf("cannot send a heartbeat: %w", err)
	}
	return nil
}

func (c *Connector) write(ctx context.Context, conn *websocket.Conn, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	return conn.Write(ctx, websocket.MessageText, data)
}

// gatewayURL is Options.GatewayURL or what GET /gateway/bot answers.
func (c *Connector) gatewayURL(ctx context.Context) (string, error) {
	if c.o.GatewayURL != "" {
		return c.o.GatewayURL, nil
	}
	c.mu.Lock()
	cached := c.gateway
	c.mu.Unlock()
	if cached != "" {
		return cached, nil
	}
	data, err := c.call(ctx, "GET", "gateway/bot", "/gateway/bot", nil, true)
	if err != nil {
		return "", fmt.Errorf("cannot get the gateway URL: %w", err)
	}
	var g struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(data, &g); err != nil || g.URL == "" {
		return "", errors.New("cannot get the gateway URL: GET /gateway/bot answered no url")
	}
	c.mu.Lock()
	c.gateway = g.URL
	c.mu.Unlock()
	return g.URL, nil
}

func (c *Connector) forgetGatewayURL() {
	c.mu.Lock()
	c.gateway = ""
	c.mu.Unlock()
}

func withGatewayQuery(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set("v", "10")
	q.Set("encoding", "json")
	u.RawQuery = q.Encode()
	if u.Path == "" {
		u.Path = "/"
	}
	return strings.TrimSpace(u.String())
}
