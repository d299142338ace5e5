package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	slackapi "github.com/slack-go/slack"

	"github.com/berth-dev/berth/services/intake/connector"
)

// stableAfter is how long a connection must have lived for the next drop to
// start the back-off from the beginning again.
const stableAfter = 30 * time.Second

// Run holds the Socket Mode connection until ctx ends; in events mode it
// returns nil at once.
func (c *Connector) Run(ctx context.Context, sink connector.Sink) error {
	if c.o.Mode != ModeSocket {
		return nil
	}
	defer c.status.Stopped()
	attempt := 0
	for ctx.Err() == nil {
		c.status.Connecting()
		lived, err := c.session(ctx, sink)
		if ctx.Err() != nil {
			return nil
		}
		if lived >= stableAfter {
			attempt = 0
		}
		attempt++
		wait := c.backoff(attempt)
		c.status.Disconnected(errors.New(c.errText(err)), c.clock.Now())
		c.log.Warn("Slack connection ended; reconnecting", "error", c.errText(err), "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(wait):
		}
	}
	return nil
}

// socketConn is one Socket Mode WebSocket. Its reader goroutine is the only
// reader; writes (acknowledgements) take writeMu, control frames need no lock.
type socketConn struct {
	ws      *websocket.Conn
	writeMu sync.Mutex
	alive   atomic.Int64 // clock nanoseconds of the last sign of life
}

type inboundFrame struct {
	conn *socketConn
	data []byte
}

type connEnd struct {
	conn *socketConn
	err  error
}

type dialResult struct {
	conn *socketConn
	err  error
}

// errLinkDisabled is Slack's disconnect with reason link_disabled: Socket
// Mode was turned off for the app.
var errLinkDisabled = errors.New("Slack disabled Socket Mode for the app (disconnect reason link_disabled)")

// session serves Socket Mode connections until the live one is lost, and
// reports how long it was connected. When Slack asks for a refresh
// (disconnect refresh_requested or warning), a new connection is opened
// while the old one keeps delivering, and the old one is closed only once
// the new one said hello: Slack's documented order, with no gap.
func (c *Connector) session(ctx context.Context, sink connector.Sink) (time.Duration, error) {
	live, err := c.dial(ctx)
	if err != nil {
		return 0, err
	}
	since := c.clock.Now()
	c.status.Connected(since)
	c.status.ClearWarning("")
	c.log.Info("connected to Slack Socket Mode")

	sctx, cancel := context.WithCancel(ctx)
	frames := make(chan inboundFrame)
	ended := make(chan connEnd)
	var wg sync.WaitGroup
	reading := map[*socketConn]bool{}
	startReading := func(sc *socketConn) {
		reading[sc] = true
		wg.Go(func() { sc.read(sctx, c.clock.Now, frames, ended) })
	}
	var replacement chan dialResult // non-nil while a fresh connection is being opened
	defer func() {
		cancel()
		if replacement != nil {
			if r := <-replacement; r.conn != nil {
				r.conn.close()
			}
		}
		for sc := range reading {
			sc.close()
		}
		wg.Wait()
	}()
	startReading(live)
	ticker := c.clock.NewTicker(c.o.PingInterval)
	defer ticker.Stop()
	lived := func() time.Duration { return c.clock.Since(since) }

	for {
		select {
		case <-ctx.Done():
			return lived(), ctx.Err()
		case in := <-frames:
			reason := c.frame(sctx, sink, in.conn, in.data)
			in.conn.alive.Store(c.clock.Now().UnixNano()) // handling it may have taken a while
			switch {
			case reason == "link_disabled":
				c.status.Warn("Slack disabled Socket Mode for the app: turn Socket Mode on again (Settings → Socket Mode)")
				return lived(), errLinkDisabled
			case reason != "" && in.conn == live && replacement == nil:
				c.log.Info("Slack asked for a fresh Socket Mode connection; opening it before closing this one", "reason", reason)
				replacement = make(chan dialResult, 1)
				wg.Go(func() {
					sc, err := c.dial(sctx)
					replacement <- dialResult{sc, err}
				})
			}
		case r := <-replacement:
			replacement = nil
			if r.err != nil {
				if live == nil {
					return lived(), r.err
				}
				c.log.Warn("cannot open a fresh Socket Mode connection; keeping the old one until Slack closes it", "error", c.errText(r.err))
				continue
			}
			old := live
			live = r.conn
			startReading(live)
			if old != nil {
				old.close()
			}
			c.log.Info("switched to the fresh Slack Socket Mode connection")
		case e := <-ended:
			delete(reading, e.conn)
			_ = e.conn.ws.Close()
			if e.conn != live {
				continue // a replaced connection closing
			}
			if replacement != nil {
				live = nil // Slack closed it first; the fresh one is on its way
				continue
			}
			return lived(), fmt.Errorf("the Socket Mode connection closed: %s", c.errText(e.err))
		case now := <-ticker.Chan():
			if live == nil {
				continue
			}
			if silent := now.Sub(time.Unix(0, live.alive.Load())); silent > c.o.PingInterval {
				return lived(), fmt.Errorf("no WebSocket ping from Slack for %s: the connection is taken as dead", silent.Round(time.Second))
			}
		}
	}
}

// dial opens one Socket Mode connection: a fresh URL from
// apps.connections.open, the WebSocket, and Slack's hello.
func (c *Connector) dial(ctx context.Context) (*socketConn, error) {
	if _, err := c.identity(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	_, wsURL, err := c.api.StartSocketModeContext(ctx)
	if err != nil {
		c.noteFatal(err)
		return nil, fmt.Errorf("cannot open a Socket Mode connection (apps.connections.open): %s", c.errText(err))
	}
	dialer := &websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: c.o.RequestTimeout,
		TLSClientConfig:  c.tlsConf,
		WriteBufferSize:  32 << 10,
	}
	ws, resp, err := dialer.DialContext(ctx, wsURL, nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("cannot connect to Slack Socket Mode: %s", c.errText(err))
	}
	sc := &socketConn{ws: ws}
	sc.alive.Store(c.clock.Now().UnixNano())
	ws.SetReadLimit(c.o.MaxFrameBytes)
	ws.SetPingHandler(func(data string) error {
		sc.alive.Store(c.clock.Now().UnixNano())
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	deadline, _ := ctx.Deadline()
	_ = ws.SetReadDeadline(deadline)
	_, hello, err := ws.ReadMessage()
	_ = ws.SetReadDeadline(time.Time{})
	var head struct {
		Type string `json:"type"`
	}
	if err == nil {
		_ = json.Unmarshal(hello, &head)
		if head.Type != "hello" {
			err = fmt.Errorf("the first frame is %q, not hello", head.Type)
		}
	}
	if err != nil {
		_ = ws.Close()
		return nil, fmt.Errorf("Slack sent no hello on the Socket Mode connection: %s", c.errText(err))
	}
	c.sawEvent()
	return sc, nil
}

// read hands every frame of sc to frames until the connection ends, which
// it reports on ended.
func (sc *socketConn) read(ctx context.Context, now func() time.Time, frames chan<- inboundFrame, ended chan<- connEnd) {
	for {
		_, data, err := sc.ws.ReadMessage()
		if err != nil {
			select {
			case ended <- connEnd{sc, err}:
			case <-ctx.Done():
			}
			return
		}
		sc.alive.Store(now().UnixNano())
		select {
		case frames <- inboundFrame{sc, data}:
		case <-ctx.Done():
			return
		}
	}
}

func (sc *socketConn) write(data []byte, timeout time.Duration) error {
	sc.writeMu.Lock()
	defer sc.writeMu.Unlock()
	_ = sc.ws.SetWriteDeadline(time.Now().Add(timeout))
	return sc.ws.WriteMessage(websocket.TextMessage, data)
}

// close says goodbye with a close frame and closes the socket.
func (sc *socketConn) close() {
	_ = sc.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = sc.ws.Close()
}

// frame handles one Socket Mode frame. It returns the reason of a
// disconnect request ("" for every other frame).
func (c *Connector) frame(ctx context.Context, sink connector.Sink, sc *socketConn, data []byte) (disconnect string) {
	var f struct {
		Type       string          `json:"type"`
		EnvelopeID string          `json:"envelope_id"`
		Payload    json.RawMessage `json:"payload"`
		Reason     string          `json:"reason"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		c.log.Warn("ignored a Slack Socket Mode frame it cannot use", "error", err, "bytes", len(data))
		return ""
	}
	c.sawEvent()
	switch f.Type {
	case "hello":
	case "disconnect":
		if f.Reason == "" {
			f.Reason = "unknown"
		}
		return f.Reason
	case "events_api":
		c.envelope(ctx, sc, sink, f.EnvelopeID, f.Payload)
	case "interactive":
		c.interactiveEnvelope(ctx, sc, sink, f.EnvelopeID, f.Payload)
	case "slash_commands":
		c.log.Info("ignored Slack envelope: berth handles messages and its approval buttons only", "type", f.Type)
		c.ack(sc, f.EnvelopeID)
	default:
		// Acknowledged when it has an envelope id, so that Slack does not
		// deliver the same frame again.
		c.log.Warn("ignored a Slack Socket Mode frame it cannot use", "type", f.Type)
		c.ack(sc, f.EnvelopeID)
	}
	return ""
}

// envelope hands one events_api envelope to the sink and acknowledges it
// once Accept returned nil.
func (c *Connector) envelope(ctx context.Context, sc *socketConn, sink connector.Sink, envelopeID string, payload json.RawMessage) {
	var cb callback
	err := json.Unmarshal(payload, &cb)
	if err == nil {
		err = c.deliver(ctx, sink, cb, "socket")
	} else {
		err = fmt.Errorf("%w: %v", errBadPayload, err)
	}
	switch {
	case err == nil:
		c.ack(sc, envelopeID)
	case errors.Is(err, errBadPayload):
		c.log.Warn("ignored a malformed Slack envelope", "error", c.errText(err))
		c.ack(sc, envelopeID)
	default:
		// Not acknowledged: Slack delivers the envelope again.
		c.status.Failed(errors.New(c.errText(err)))
	}
}

// interactiveEnvelope is envelope for an "interactive" one: a click.
func (c *Connector) interactiveEnvelope(ctx context.Context, sc *socketConn, sink connector.Sink, envelopeID string, payload json.RawMessage) {
	err := c.interaction(ctx, sink, payload, "socket")
	switch {
	case err == nil:
		c.ack(sc, envelopeID)
	case errors.Is(err, errBadPayload):
		c.log.Warn("ignored a malformed Slack interaction", "error", c.errText(err))
		c.ack(sc, envelopeID)
	default:
		// Not acknowledged: Slack tells the user the click failed.
		c.status.Failed(errors.New(c.errText(err)))
	}
}

func (c *Connector) ack(sc *socketConn, envelopeID string) {
	if envelopeID == "" {
		return
	}
	b, err := json.Marshal(struct {
		EnvelopeID string `json:"envelope_id"`
	}{envelopeID})
	if err == nil {
		err = sc.write(b, c.o.RequestTimeout)
	}
	if err != nil {
		c.log.Warn("cannot acknowledge a Slack envelope; Slack will deliver it again", "error", c.errText(err))
	}
}

// noteFatal turns a refusal of the app token into a standing warning.
func (c *Connector) noteFatal(err error) {
	var se slackapi.SlackErrorResponse
	var sc slackapi.StatusCodeError
	switch {
	case errors.As(err, &se) && authRefused(se.Err):
		c.status.Warn(fmt.Sprintf("Slack refused app_token (%s): check the app-level token (scope connections:write) and that Socket Mode is on", se.Err))
	case errors.As(err, &sc) && sc.Code == http.StatusNotFound:
		c.status.Warn("Slack refused app_token: check the app-level token (scope connections:write) and that Socket Mode is on")
	}
}
