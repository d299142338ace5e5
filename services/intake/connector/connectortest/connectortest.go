// Package connectortest is a fake connector.Connector for tests of intake's
// machinery: tests push inbound messages through the Sink intake handed to
// Run, see each reply Send got, and decide what Send answers.
package connectortest

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Connector is a fake platform connection. The zero value is not usable:
// build it with New.
type Connector struct {
	// SendFunc, when set, decides what Send returns (after the reply was
	// recorded). It may block until ctx ends, like a platform that never
	// answers.
	SendFunc func(ctx context.Context, r connector.Reply) error
	// Receiver, when set, is served by intake at /hooks/{id}.
	Receiver http.Handler
	// Long says whether the connector holds a connection open.
	Long bool
	// FailRuns is how many Run calls fail at once (a gateway that refuses
	// the connection) before Run holds the sink.
	FailRuns int

	mu      sync.Mutex
	sink    connector.Sink
	running chan struct{} // closed once Run has a sink
	stopped chan struct{} // closed when Run returns
	runs    int
	failed  int
	sent    []connector.Reply
	sentCh  chan connector.Reply
	typing  []string
	typeCh  chan string
	status  connector.Status
	changed chan struct{} // closed and replaced by SetStatus
}

// New returns a fake connector whose Status starts as st.
func New(st connector.Status) *Connector {
	return &Connector{
		running: make(chan struct{}),
		stopped: make(chan struct{}),
		sentCh:  make(chan connector.Reply, 1024),
		typeCh:  make(chan string, 1024),
		status:  st,
		changed: make(chan struct{}),
	}
}

// Run holds the sink until ctx ends.
func (c *Connector) Run(ctx context.Context, sink connector.Sink) error {
	c.mu.Lock()
	if c.FailRuns > 0 {
		c.FailRuns--
		c.failed++
		c.mu.Unlock()
		return errors.New("gateway refused the connection")
	}
	c.sink = sink
	c.runs++
	if c.runs == 1 {
		close(c.running)
	}
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	if c.runs == 1 {
		close(c.stopped)
	}
	c.mu.Unlock()
	return nil
}

// FailedRuns is how many Run calls have failed (FailRuns).
func (c *Connector) FailedRuns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// Running is closed once Run holds the sink.
func (c *Connector) Running() <-chan struct{} { return c.running }

// Stopped is closed when the first Run has returned.
func (c *Connector) Stopped() <-chan struct{} { return c.stopped }

// Deliver hands m to the sink as the platform's event would, and returns
// what Accept returned. It waits for Run to have started.
func (c *Connector) Deliver(ctx context.Context, m connector.Message) error {
	select {
	case <-c.running:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	sink := c.sink
	c.mu.Unlock()
	return sink.Accept(ctx, m)
}

// Send records r and answers with SendFunc (nil when unset).
func (c *Connector) Send(ctx context.Context, r connector.Reply) error {
	c.mu.Lock()
	c.sent = append(c.sent, r)
	f := c.SendFunc
	c.mu.Unlock()
	c.sentCh <- r
	if f != nil {
		return f(ctx, r)
	}
	return nil
}

// Sends delivers every reply Send is called with, in order (retries too).
func (c *Connector) Sends() <-chan connector.Reply { return c.sentCh }

// NextSend waits up to timeout for the next Send call.
func (c *Connector) NextSend(timeout time.Duration) (connector.Reply, bool) {
	select {
	case r := <-c.sentCh:
		return r, true
	case <-time.After(timeout):
		return connector.Reply{}, false
	}
}

// Sent returns every reply Send was called with so far.
func (c *Connector) Sent() []connector.Reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]connector.Reply(nil), c.sent...)
}

// Status returns the status set with SetStatus.
func (c *Connector) Status() connector.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// WatchStatus returns the status and a channel closed at the next SetStatus.
func (c *Connector) WatchStatus() (connector.Status, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.changed
}

// SetStatus changes what Status returns.
func (c *Connector) SetStatus(st connector.Status) {
	c.mu.Lock()
	c.status = st
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// LongLived implements connector.LongLived.
func (c *Connector) LongLived() bool { return c.Long }

// Handler implements connector.HTTPReceiver when Receiver is set; intake
// serves what it returns.
func (c *Connector) Handler(sink connector.Sink) http.Handler {
	if c.Receiver == nil {
		return http.NotFoundHandler()
	}
	return c.Receiver
}

// Typing implements connector.Typer: it records the channel.
func (c *Connector) Typing(_ context.Context, channel string, _ map[string]string) error {
	c.mu.Lock()
	c.typing = append(c.typing, channel)
	c.mu.Unlock()
	c.typeCh <- channel
	return nil
}

// Typings delivers the channel of every Typing call.
func (c *Connector) Typings() <-chan string { return c.typeCh }
