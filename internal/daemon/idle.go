package daemon

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// ExitIdle is the exit status of a service that stopped because it had
// nothing to do. Units list it in SuccessExitStatus=, so systemd neither
// restarts the service nor counts it as failed; the socket or the bus starts
// it again on demand.
const ExitIdle = 75

// Idle tracks whether a service has work: HTTP requests in flight, and
// whatever its busy function reports (pending messages, a long-lived
// connection to keep).
type Idle struct {
	clock    clockwork.Clock
	mu       sync.Mutex
	inFlight int
	last     time.Time
}

// NewIdle returns a tracker whose idle time starts now on clock (nil: the
// real clock).
func NewIdle(clock clockwork.Clock) *Idle {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Idle{clock: clock, last: clock.Now()}
}

// Touch records activity now.
func (i *Idle) Touch() {
	i.mu.Lock()
	i.last = i.clock.Now()
	i.mu.Unlock()
}

// Handler counts h's requests as activity for as long as they run.
func (i *Idle) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i.mu.Lock()
		i.inFlight++
		i.last = i.clock.Now()
		i.mu.Unlock()
		defer func() {
			i.mu.Lock()
			i.inFlight--
			i.last = i.clock.Now()
			i.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// IdleCheckInterval is how often Wait looks for work when waiting for after
// of idleness: a tenth of it, between 10ms and 10s.
func IdleCheckInterval(after time.Duration) time.Duration {
	return min(max(after/10, 10*time.Millisecond), 10*time.Second)
}

// Wait blocks until the service has been idle for after — no request in
// flight and busy reporting false the whole time — and returns true; or
// until ctx is done and returns false. busy may be nil.
func (i *Idle) Wait(ctx context.Context, after time.Duration, busy func() bool) bool {
	t := i.clock.NewTicker(IdleCheckInterval(after))
	defer t.Stop()
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return false
		case now = <-t.Chan():
		}
		// now is the check's time, so that a slow busy does not shift it.
		if busy != nil && busy() {
			i.mu.Lock()
			if now.After(i.last) {
				i.last = now
			}
			i.mu.Unlock()
			continue
		}
		i.mu.Lock()
		idle := i.inFlight == 0 && now.Sub(i.last) >= after
		i.mu.Unlock()
		if idle {
			return true
		}
	}
}
