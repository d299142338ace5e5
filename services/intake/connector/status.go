package connector

import (
	"strings"
	"sync"
	"time"
)

// StatusKeeper holds one connector's Status so that every platform counts
// and clears the same way: Reconnects counts connection attempts after the
// first whether or not any succeeded, and LastError (with LastErrorAt) stays
// only until the connector is healthy again. It is safe for concurrent use.
type StatusKeeper struct {
	now func() time.Time

	mu       sync.Mutex
	st       Status
	attempts int
	// requestErr says LastError came from Failed (a request), not from the
	// connection: Healthy clears only such an error while disconnected.
	requestErr bool
	changed    chan struct{} // closed and replaced on every change
}

// NewStatusKeeper returns a keeper for a connector of type typ in state
// (StateConnecting for a gateway, StateHTTP for an HTTP-only connector).
// now stamps the errors Failed records; nil means time.Now.
func NewStatusKeeper(typ, state string, now func() time.Time) *StatusKeeper {
	if now == nil {
		now = time.Now
	}
	return &StatusKeeper{now: now, st: Status{Type: typ, State: state}, changed: make(chan struct{})}
}

func (k *StatusKeeper) update(f func(s *Status)) {
	k.mu.Lock()
	f(&k.st)
	close(k.changed)
	k.changed = make(chan struct{})
	k.mu.Unlock()
}

func (k *StatusKeeper) setError(s *Status, err error, at time.Time, fromRequest bool) {
	if err == nil {
		return
	}
	s.LastError, s.LastErrorAt = err.Error(), at.UTC()
	k.requestErr = fromRequest
}

func (k *StatusKeeper) clearError(s *Status) {
	s.LastError, s.LastErrorAt = "", time.Time{}
	k.requestErr = false
}

// Connecting records the start of a connection attempt; every attempt after
// the first counts as a reconnect.
func (k *StatusKeeper) Connecting() {
	k.update(func(s *Status) {
		k.attempts++
		s.Reconnects = k.attempts - 1
		s.State, s.ConnectedSince = StateConnecting, time.Time{}
	})
}

// Connected records a connection established at now; it clears the last
// error.
func (k *StatusKeeper) Connected(now time.Time) {
	k.update(func(s *Status) {
		s.State, s.ConnectedSince = StateConnected, now
		k.clearError(s)
	})
}

// Disconnected records a connection that ended (or could not be opened) at
// now because of err; the connector waits to reconnect. err must not hold
// a credential.
func (k *StatusKeeper) Disconnected(err error, now time.Time) {
	k.update(func(s *Status) {
		s.State, s.ConnectedSince = StateDisconnected, time.Time{}
		k.setError(s, err, now, false)
	})
}

// Failed records a request that failed (a reply not posted, an event not
// stored) without changing the connection's state. err must not hold a
// credential.
func (k *StatusKeeper) Failed(err error) {
	now := k.now()
	k.update(func(s *Status) { k.setError(s, err, now, true) })
}

// Healthy records a later request that succeeded: it clears the last error,
// unless the connection is down and the error says why.
func (k *StatusKeeper) Healthy() {
	k.mu.Lock()
	unchanged := k.st.LastError == "" || (k.st.State == StateDisconnected && !k.requestErr)
	k.mu.Unlock()
	if unchanged {
		return
	}
	k.update(func(s *Status) {
		if s.State != StateDisconnected || k.requestErr {
			k.clearError(s)
		}
	})
}

// Stopped records that Run returned.
func (k *StatusKeeper) Stopped() {
	k.update(func(s *Status) { s.State, s.ConnectedSince = StateStopped, time.Time{} })
}

// Saw records an inbound event at now.
func (k *StatusKeeper) Saw(now time.Time) {
	k.update(func(s *Status) { s.LastEvent = now })
}

// Warn sets the standing warning (a problem an admin must fix).
func (k *StatusKeeper) Warn(warning string) {
	k.update(func(s *Status) { s.Warning = warning })
}

// ClearWarning removes the warning if it starts with prefix ("" for any).
func (k *StatusKeeper) ClearWarning(prefix string) {
	k.update(func(s *Status) {
		if strings.HasPrefix(s.Warning, prefix) {
			s.Warning = ""
		}
	})
}

// Snapshot returns the current Status.
func (k *StatusKeeper) Snapshot() Status {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st
}

// Watch returns the current Status and a channel closed at the next change,
// so that a caller can wait for a state without polling.
func (k *StatusKeeper) Watch() (Status, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st, k.changed
}
