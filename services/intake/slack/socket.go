package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	slackapi "github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"

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
	defer c.update(func(s *connector.Status) {
		s.State = connector.StateStopped
		s.ConnectedSince = time.Time{}
	})
	attempt := 0
	everConnected := false
	for ctx.Err() == nil {
		connected, lived, err := c.connection(ctx, sink, everConnected)
		if ctx.Err() != nil {
			return nil
		}
		if connected {
			everConnected = true
		}
		if connected && lived >= stableAfter {
			attempt = 0
		}
		attempt++
		wait := c.backoff(attempt)
		c.update(func(s *connector.Status) {
			s.State = connector.StateDisconnected
			s.ConnectedSince = time.Time{}
			s.LastError = c.errText(err)
		})
		c.log.Warn("Slack connection ended; reconnecting", "error", c.errText(err), "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(wait):
		}
	}
	return nil
}

// errDropped says a connection ended (Slack's disconnect, a dropped
// socket, a dead ping); socketmode does not tell which.
var errDropped = errors.New("the Socket Mode connection closed")

// connection opens one Socket Mode connection (a new URL from
// apps.connections.open) and serves it until it ends. It reports whether it
// got connected and for how long.
func (c *Connector) connection(ctx context.Context, sink connector.Sink, reconnect bool) (connected bool, lived time.Duration, err error) {
	c.update(func(s *connector.Status) { s.State = connector.StateConnecting })
	if _, err := c.identity(ctx); err != nil {
		return false, 0, err
	}
	dialer := &websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: c.o.RequestTimeout,
		TLSClientConfig:  c.tlsConf,
		WriteBufferSize:  32 << 10,
	}
	// socketmode reconnects by itself when a connection ends; its client
	// may open one connection only, so that its own second attempt fails at
	// once and Run reconnects with its back-off and a fresh URL.
	smc := socketmode.New(c.newAPI(&singleOpen{hc: c.hc}),
		socketmode.OptionDialer(dialer),
		socketmode.OptionPingInterval(c.o.PingInterval),
		socketmode.OptionReadLimit(c.o.MaxFrameBytes),
		socketmode.OptionLog(libraryLog{c}),
	)
	sctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- smc.RunContext(sctx) }()
	defer func() {
		cancel()
		<-runErr // socketmode stops on cancel; its event sends give up on sctx
	}()

	var since time.Time
	ended := func(err error) (bool, time.Duration, error) {
		if since.IsZero() {
			return false, 0, err
		}
		return true, c.clock.Since(since), err
	}
	for {
		select {
		case <-ctx.Done():
			return ended(ctx.Err())
		case err := <-runErr:
			runErr <- err // for the deferred wait
			if err == nil {
				err = errDropped
			}
			c.noteFatal(err)
			return ended(fmt.Errorf("cannot hold the Socket Mode connection: %s", c.errText(err)))
		case evt := <-smc.Events:
			switch evt.Type {
			case socketmode.EventTypeConnecting:
				if d, ok := evt.Data.(*slackapi.ConnectingEvent); ok && d.ConnectionCount > 0 {
					// The connection ended and socketmode is about to
					// reconnect by itself: we reconnect with our back-off.
					return ended(errDropped)
				}
			case socketmode.EventTypeConnectionError:
				var cause error = errDropped
				if d, ok := evt.Data.(*slackapi.ConnectionErrorEvent); ok && d.ErrorObj != nil {
					cause = d.ErrorObj
				}
				return ended(fmt.Errorf("cannot connect to Slack Socket Mode: %s", c.errText(cause)))
			case socketmode.EventTypeInvalidAuth:
				c.update(func(s *connector.Status) {
					s.Warning = "Slack refused app_token: check the app-level token (scope connections:write) and that Socket Mode is on"
				})
			case socketmode.EventTypeConnected:
				since = c.clock.Now()
				c.update(func(s *connector.Status) {
					s.State = connector.StateConnected
					s.ConnectedSince = since
					s.LastError = ""
					s.Warning = ""
					if reconnect {
						s.Reconnects++
					}
				})
				c.log.Info("connected to Slack Socket Mode")
			case socketmode.EventTypeHello:
				c.sawEvent()
			case socketmode.EventTypeEventsAPI:
				c.envelope(sctx, smc, sink, evt.Request)
			case socketmode.EventTypeSlashCommand, socketmode.EventTypeInteractive:
				c.sawEvent()
				c.log.Info("ignored Slack envelope: berth handles messages only", "type", string(evt.Type))
				c.ack(sctx, smc, evt.Request)
			case socketmode.EventTypeErrorBadMessage:
				c.sawEvent()
				c.badFrame(sctx, smc, sink, evt.Data)
			case socketmode.EventTypeIncomingError:
				if d, ok := evt.Data.(*slackapi.IncomingEventError); ok {
					c.log.Warn("unreadable Slack Socket Mode frame", "error", c.errText(d.ErrorObj))
				}
			case socketmode.EventTypeErrorWriteFailed:
				if d, ok := evt.Data.(*socketmode.ErrorWriteFailed); ok {
					c.log.Warn("cannot acknowledge a Slack envelope; Slack will deliver it again", "error", c.errText(d.Cause))
				}
			}
		}
	}
}

// singleOpen lets one apps.connections.open call through.
type singleOpen struct {
	hc   *http.Client
	used atomic.Bool
}

var errOneConnection = errors.New("this Socket Mode client has had its connection")

func (s *singleOpen) Do(req *http.Request) (*http.Response, error) {
	if s.used.Swap(true) {
		return nil, errOneConnection
	}
	return s.hc.Do(req)
}

// envelope hands one events_api envelope to the sink and acknowledges it
// once Accept returned nil.
func (c *Connector) envelope(ctx context.Context, smc *socketmode.Client, sink connector.Sink, req *socketmode.Request) {
	if req == nil {
		return
	}
	var cb callback
	err := json.Unmarshal(req.Payload, &cb)
	if err == nil {
		err = c.deliver(ctx, sink, cb, "socket")
	} else {
		err = fmt.Errorf("%w: %v", errBadPayload, err)
	}
	switch {
	case err == nil:
		c.ack(ctx, smc, req)
	case errors.Is(err, errBadPayload):
		c.log.Warn("ignored a malformed Slack envelope", "error", c.errText(err))
		c.ack(ctx, smc, req)
	default:
		// Not acknowledged: Slack delivers the envelope again.
		c.update(func(s *connector.Status) { s.LastError = c.errText(err) })
	}
}

func (c *Connector) ack(ctx context.Context, smc *socketmode.Client, req *socketmode.Request) {
	if req == nil || req.EnvelopeID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	if err := smc.AckCtx(ctx, req.EnvelopeID, nil); err != nil {
		c.log.Warn("cannot acknowledge a Slack envelope; Slack will deliver it again", "error", c.errText(err))
	}
}

// badFrame handles a frame socketmode could not use. An events_api envelope
// whose inner event slack-go does not know is still read as an Events API
// callback; anything else is logged and acknowledged when it has an envelope
// id, so that Slack does not deliver the same garbage again.
func (c *Connector) badFrame(ctx context.Context, smc *socketmode.Client, sink connector.Sink, data any) {
	d, ok := data.(*socketmode.ErrorBadMessage)
	if !ok {
		return
	}
	var frame struct {
		Type       string          `json:"type"`
		EnvelopeID string          `json:"envelope_id"`
		Payload    json.RawMessage `json:"payload"`
	}
	_ = json.Unmarshal(d.Message, &frame)
	if frame.Type == socketmode.RequestTypeEventsAPI && frame.EnvelopeID != "" {
		c.envelope(ctx, smc, sink, &socketmode.Request{EnvelopeID: frame.EnvelopeID, Payload: frame.Payload})
		return
	}
	c.log.Warn("ignored a Slack Socket Mode frame it cannot use", "type", frame.Type, "error", c.errText(d.Cause))
	if frame.EnvelopeID != "" {
		c.ack(ctx, smc, &socketmode.Request{EnvelopeID: frame.EnvelopeID})
	}
}

// noteFatal turns a refusal of the app token into a standing warning.
func (c *Connector) noteFatal(err error) {
	var se slackapi.SlackErrorResponse
	code := err.Error()
	if errors.As(err, &se) {
		code = se.Err
	}
	if authRefused(code) {
		c.update(func(s *connector.Status) {
			s.Warning = fmt.Sprintf("Slack refused app_token (%s): check the app-level token (scope connections:write) and that Socket Mode is on", code)
		})
	}
}
