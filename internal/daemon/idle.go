package daemon

import (
	"context"
	"net/http"
	"sync"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

// ExitIdle is the exit status of a service that stopped because it had
// nothing to do. Units list it in SuccessExitStatus=, so systemd neither
// restarts the service nor counts it as failed; the socket or the bus starts
// it again on demand.
const ExitIdle = 75

// watchdogTicks ticks at half the watchdog interval systemd asked for
// (WatchdogSec=), or never when there is no watchdog.
func watchdogTicks() (<-chan time.Time, func()) {
	interval, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(interval / 2)
	return t.C, t.Stop
}

// Idle tracks whether a service has work: HTTP requests in flight, and
// whatever its busy function reports (pending messages, a long-lived
// connection to keep).
type Idle struct {
	mu       sync.Mutex
	inFlight int
	last     time.Time
	now      func() time.Time
}

// NewIdle returns a tracker whose idle time starts now.
func NewIdle() *Idle {
	return &Idle{last: time.Now(), now: time.Now}
}

// Touch records activity now.
func (i *Idle) Touch() {
	i.mu.Lock()
	i.last = i.now()
	i.mu.Unlock()
}

// Handler counts h's requests as activity for as long as they run.
func (i *Idle) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i.mu.Lock()
		i.inFlight++
		i.last = i.now()
		i.mu.Unlock()
		defer func() {
			i.mu.Lock()
			i.inFlight--
			i.last = i.now()
			i.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// Wait blocks until the service has been idle for after — no request in
// flight and busy reporting false the whole time — and returns true; or
// until ctx is done and returns false. busy may be nil.
func (i *Idle) Wait(ctx context.Context, after time.Duration, busy func() bool) bool {
	check := min(max(after/10, 10*time.Millisecond), 10*time.Second)
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if busy != nil && busy() {
			i.Touch()
			continue
		}
		i.mu.Lock()
		idle := i.inFlight == 0 && i.now().Sub(i.last) >= after
		i.mu.Unlock()
		if idle {
			return true
		}
	}
}
