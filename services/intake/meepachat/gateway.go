package meepachat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/services/intake/connector"
)

// noChannelWarning is the standing warning of a bot that was added nowhere.
const noChannelWarning = "the bot is in no channel: add it to a server (Server Settings → Bots) or a channel"

// errAccept marks a session ended because intake could not take a message.
var errAccept = errors.New("intake could not store a message")

// Run holds the gateway connection until ctx ends, reconnecting with capped
// exponential back-off and jitter.
func (c *Connector) Run(ctx context.Context, sink connector.Sink) error {
	var pending *connector.Message // a message Accept refused, offered again first
	failures := 0
	defer c.status.Stopped()
	for {
		c.status.Connecting()
		healthy, err := c.session(ctx, sink, &pending)
		if ctx.Err() != nil {
			return nil
		}
		if healthy {
			failures = 0
		}
		failures++
		wait := c.backoff(failures)
		c.log.Warn("meepachat gateway unavailable; reconnecting", "error", err, "retry_in", wait.String())
		c.status.Disconnected(err, c.clock.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(wait):
		}
	}
}

// backoff is BackoffMin doubling per failure up to BackoffMax, less a random
// quarter so that many clients do not come back together.
func (c *Connector) backoff(failures int) time.Duration {
	return backoff.Policy{Min: c.o.BackoffMin, Max: c.o.BackoffMax, Jitter: 0.25}.Delay(failures)
}

// session is one gateway connection: dial, ready, subscribe, then events
// until the connection ends. healthy says it got as far as ready and ended
// for a reason of the connection's, not intake's.
func (c *Connector) session(ctx context.Context, sink connector.Sink, pending **connector.Message) (healthy bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var lastSeen atomic.Int64 // clock nanoseconds of the last inbound frame
	touch := func() {
		now := c.clock.Now()
		lastSeen.Store(now.UnixNano())
		c.status.Saw(now)
	}
	dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
	conn, resp, err := websocket.Dial(dctx, c.gateway, &websocket.DialOptions{
		HTTPClient: c.client,
		HTTPHeader: http.Header{"Authorization": {"Bot " + c.o.Token}},
		OnPingReceived: func(context.Context, []byte) bool {
			touch()
			return true
		},
	})
	dcancel()
	if err != nil {
		return false, c.dialError(resp, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(c.o.MaxFrameBytes)
	touch()
	opened := c.clock.Now() // taken here, not in the watcher, which may start late

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	dead := make(chan string, 1)
	var isReady atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.watch(ctx, conn, opened, &lastSeen, &isReady, dead)
	}()
	defer func() {
		c.mu.Lock()
		if c.conn == conn {
			c.conn = nil
		}
		c.mu.Unlock()
	}()

	ready := false
	unknown := map[string]bool{}
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			select {
			case why := <-dead:
				return ready, errors.New(why)
			default:
			}
			if errors.Is(err, websocket.ErrMessageTooBig) {
				c.log.Warn("meepachat gateway sent a frame over the size limit; refused", "limit_bytes", c.o.MaxFrameBytes)
				return ready, fmt.Errorf("the gateway sent a frame over %d bytes", c.o.MaxFrameBytes)
			}
			if !ready {
				return false, fmt.Errorf("the gateway closed the connection before ready: %w", err)
			}
			return true, fmt.Errorf("cannot read from the gateway: %w", err)
		}
		touch()
		if typ != websocket.MessageText {
			c.log.Warn("meepachat gateway sent a binary frame; ignored", "bytes", len(data))
			continue
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil || f.Type == "" {
			c.log.Warn("meepachat gateway sent a malformed frame; ignored", "bytes", len(data))
			continue
		}
		if !ready && f.Type != "ready" {
			c.log.Warn("meepachat gateway sent an event before ready; ignored", "type", f.Type)
			continue
		}
		switch f.Type {
		case "ready":
			// Marked before onReady's subscribe writes and status: a ready
			// read in time is in time, and a reader of the status never sees
			// connected while the watcher still waits for ready. A malformed
			// first ready ends the session anyway.
			isReady.Store(true)
			if err := c.onReady(ctx, conn, f.Data); err != nil {
				c.log.Warn("meepachat gateway sent a malformed ready event", "error", err)
				if !ready {
					return false, err
				}
				continue
			}
			ready = true
			if *pending != nil {
				if err := c.accept(ctx, sink, **pending); err != nil {
					return false, err // intake in trouble: let the back-off grow
				}
				*pending = nil
			}
		case "message.created":
			m, ok := c.message(f.Data)
			if !ok {
				continue
			}
			if err := c.accept(ctx, sink, m); err != nil {
				*pending = &m
				return false, err
			}
		case "channel.created":
			c.onChannel(ctx, conn, f.Data)
		case "server.added":
			c.onServer(ctx, conn, f.Data)
		case "pong", "message.updated", "message.deleted", "reaction.sync", "typing",
			"channel.updated", "channel.deleted", "presence.initial", "presence.update":
		default:
			if !unknown[f.Type] {
				unknown[f.Type] = true
				c.log.Info("meepachat gateway sent an unknown event type; ignored", "type", f.Type)
			}
		}
	}
}

// dialError turns a failed handshake into an error that says what to fix,
// and a standing warning when the token was refused.
func (c *Connector) dialError(resp *http.Response, err error) error {
	if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
		msg := fmt.Sprintf("the gateway refused the bot token (HTTP %d)", resp.StatusCode)
		c.status.Warn(msg + ": check the token and that the bot still exists")
		return errors.New(msg)
	}
	if resp != nil {
		return fmt.Errorf("the gateway answered HTTP %d instead of upgrading", resp.StatusCode)
	}
	return fmt.Errorf("cannot connect to the gateway: %w", err)
}

// watch pings after pingAfter of silence and closes the connection after
// deadAfter of silence, or when no ready came within readyWithin of opened.
func (c *Connector) watch(ctx context.Context, conn *websocket.Conn, opened time.Time, lastSeen *atomic.Int64, ready *atomic.Bool, dead chan<- string) {
	t := c.clock.NewTicker(pingAfter / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		silent := c.clock.Since(time.Unix(0, lastSeen.Load()))
		switch {
		case !ready.Load() && c.clock.Since(opened) >= readyWithin:
			c.log.Warn("meepachat gateway sent no ready event; dropping the connection", "waited", readyWithin.String())
			dead <- fmt.Sprintf("no ready event from the gateway within %s", readyWithin)
			conn.CloseNow()
			return
		case silent >= deadAfter:
			c.log.Warn("meepachat gateway silent; dropping the connection", "silent_for", silent.String())
			dead <- fmt.Sprintf("no frame from the gateway for %s: connection taken as dead", deadAfter)
			conn.CloseNow()
			return
		case silent >= pingAfter:
			if err := c.write(ctx, conn, "ping", nil); err != nil {
				c.log.Debug("cannot ping the meepachat gateway", "error", err)
			}
		}
	}
}

func (c *Connector) write(ctx context.Context, conn *websocket.Conn, typ string, data any) error {
	b, err := encodeFrame(typ, data)
	if err != nil {
		return err
	}
	return c.writeRaw(ctx, conn, b)
}

func (c *Connector) writeRaw(ctx context.Context, conn *websocket.Conn, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("cannot write to the gateway: %w", err)
	}
	return nil
}

func (c *Connector) subscribe(ctx context.Context, conn *websocket.Conn, ids []string) error {
	frames, skipped := subscribeFrames(ids)
	for _, id := range skipped {
		c.log.Warn("meepachat channel id too long to subscribe; skipped", "channel", truncate(id, 64))
	}
	for _, b := range frames {
		if err := c.writeRaw(ctx, conn, b); err != nil {
			return fmt.Errorf("cannot subscribe: %w", err)
		}
	}
	return nil
}

func (c *Connector) onReady(ctx context.Context, conn *websocket.Conn, data json.RawMessage) error {
	var r readyData
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("cannot decode ready: %w", err)
	}
	if r.User == nil || r.User.ID == "" {
		return errors.New("ready carries no bot user")
	}
	channels := map[string]channelInfo{}
	var ids []string
	for _, s := range r.Servers {
		for _, ch := range s.Channels {
			if ch.ID == "" {
				continue
			}
			channels[ch.ID] = channelInfo{server: s.ID, name: ch.Name}
			ids = append(ids, ch.ID)
		}
	}
	for _, ch := range r.DMChannels {
		if ch.ID == "" {
			continue
		}
		channels[ch.ID] = channelInfo{dm: true, name: ch.Name}
		ids = append(ids, ch.ID)
	}
	c.mu.Lock()
	c.bot, c.channels, c.conn = *r.User, channels, conn
	c.mu.Unlock()
	if err := c.subscribe(ctx, conn, ids); err != nil {
		return err
	}
	now := c.clock.Now()
	c.status.Connected(now)
	c.status.ClearWarning("")
	if len(ids) == 0 {
		c.status.Warn(noChannelWarning)
	}
	c.log.Info("meepachat gateway ready", "servers", len(r.Servers), "channels", len(ids))
	return nil
}

func (c *Connector) onChannel(ctx context.Context, conn *websocket.Conn, data json.RawMessage) {
	var ch wireChannel
	if err := json.Unmarshal(data, &ch); err != nil || ch.ID == "" {
		c.log.Warn("meepachat gateway sent a malformed channel.created; ignored")
		return
	}
	info := channelInfo{name: ch.Name, dm: ch.IsDM}
	if ch.ServerID != nil {
		info.server = *ch.ServerID
	} else {
		info.dm = true
	}
	c.mu.Lock()
	c.channels[ch.ID] = info
	c.mu.Unlock()
	if err := c.subscribe(ctx, conn, []string{ch.ID}); err != nil {
		c.log.Warn("cannot subscribe to a new meepachat channel", "channel", ch.ID, "error", err)
	}
}

func (c *Connector) onServer(ctx context.Context, conn *websocket.Conn, data json.RawMessage) {
	var s wireServer
	if err := json.Unmarshal(data, &s); err != nil || s.ID == "" {
		c.log.Warn("meepachat gateway sent a malformed server.added; ignored")
		return
	}
	var ids []string
	c.mu.Lock()
	for _, ch := range s.Channels {
		if ch.ID != "" {
			c.channels[ch.ID] = channelInfo{server: s.ID, name: ch.Name}
			ids = append(ids, ch.ID)
		}
	}
	c.mu.Unlock()
	c.log.Info("meepachat bot added to a server", "server", s.ID, "channels", len(ids))
	if err := c.subscribe(ctx, conn, ids); err != nil {
		c.log.Warn("cannot subscribe to a new meepachat server's channels", "server", s.ID, "error", err)
	}
	if len(ids) > 0 {
		c.status.ClearWarning(noChannelWarning)
	}
}

// message turns a message.created into a Message, or says it is not for us.
func (c *Connector) message(data json.RawMessage) (connector.Message, bool) {
	var w wireMessage
	if err := json.Unmarshal(data, &w); err != nil || w.ID == "" || w.ChannelID == "" {
		c.log.Warn("meepachat gateway sent a malformed message.created; ignored")
		return connector.Message{}, false
	}
	c.mu.Lock()
	bot := c.bot
	info, known := c.channels[w.ChannelID]
	c.mu.Unlock()
	log := c.log.With("message_id", w.ID, "channel", w.ChannelID)
	if w.UserID == bot.ID || (w.User != nil && w.User.ID == bot.ID) {
		return connector.Message{}, false
	}
	if w.User != nil && w.User.Bot && !c.o.AllowBots {
		log.Debug("meepachat message from another bot; ignored")
		return connector.Message{}, false
	}
	files := c.attachments(w)
	if strings.TrimSpace(w.Content) == "" && len(files) == 0 {
		log.Debug("meepachat message without text or files; ignored")
		return connector.Message{}, false
	}
	// A decision on one of berth's approvals is for the bot, mention or not.
	if _, decision := connector.ParseDecision(w.Content); c.o.Trigger == TriggerMention && !info.dm && !mentions(w, bot) && !decision {
		// A file alone mentions nobody: in a channel it is for the bot only
		// with a mention, as text is.
		log.Debug("meepachat message does not mention the bot; ignored")
		return connector.Message{}, false
	}
	// Like Slack and Discord, the agent gets the text without the bot's
	// leading mention, so that "@berth /sh ls" is the command "/sh ls".
	text := stripLeadingMention(w.Content, bot)
	if text == "" && len(files) == 0 {
		log.Debug("meepachat message is only a mention of the bot; ignored")
		return connector.Message{}, false
	}
	if !known {
		log.Warn("meepachat message in a channel the gateway did not list; its reply may not find the server")
	}
	m := connector.Message{
		Connector: c.id, ID: w.ID, Channel: w.ChannelID, ChannelName: info.name,
		Server: info.server, Thread: w.ThreadID, Author: w.UserID, Text: text,
		Meta: map[string]string{}, Files: files,
	}
	if w.User == nil || !w.User.Bot {
		m.AuthorID = w.UserID // who decides approvals; never a bot
	}
	if info.dm {
		m.Meta[MetaDM] = "true"
	} else if info.server != "" {
		m.Meta[MetaServer] = info.server
	}
	return m, true
}

func mentions(w wireMessage, bot botUser) bool {
	for _, m := range w.Mentions {
		if m.ID == bot.ID {
			return true
		}
	}
	return bot.Username != "" && strings.Contains(strings.ToLower(w.Content), "@"+strings.ToLower(bot.Username))
}

// stripLeadingMention removes the bot's mention ("<@id>" or "@username",
// any case) from the start of content, with the whitespace around it.
func stripLeadingMention(content string, bot botUser) string {
	text := strings.TrimSpace(content)
	var forms []string
	if bot.ID != "" {
		forms = append(forms, "<@"+bot.ID+">")
	}
	if bot.Username != "" {
		forms = append(forms, "@"+bot.Username)
	}
	for _, form := range forms {
		if len(text) < len(form) || !strings.EqualFold(text[:len(form)], form) {
			continue
		}
		rest := text[len(form):]
		// "@berthbot" is not a mention of "@berth".
		if r, _ := utf8.DecodeRuneInString(rest); rest != "" && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("_-.", r)) {
			continue
		}
		return strings.TrimSpace(rest)
	}
	return text
}

// accept hands m to intake; only a nil answer counts the event as handled.
func (c *Connector) accept(ctx context.Context, sink connector.Sink, m connector.Message) error {
	if err := sink.Accept(ctx, m); err != nil {
		c.log.Warn("intake could not store a meepachat message; it is kept and offered again after reconnecting",
			"message_id", m.ID, "error", err)
		return fmt.Errorf("%w (message %s): %v", errAccept, m.ID, err)
	}
	c.log.Debug("meepachat message handed to intake", "message_id", m.ID, "channel", m.Channel)
	return nil
}

// Typing shows the bot typing in channel while a run is in progress.
func (c *Connector) Typing(ctx context.Context, channel string, _ map[string]string) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return errors.New("cannot send typing: the meepachat gateway is not connected")
	}
	return c.write(ctx, conn, "typing", typingData{ChannelID: channel})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
