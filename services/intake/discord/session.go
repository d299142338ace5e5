package discord

import (
	"encoding/json"
	"log/slog"
	"sync"
)

// SessionStore keeps a connector's Gateway session across restarts. Run
// uses it when the Sink it is given implements it (intake's Service does,
// in intake.db); otherwise the session lives only in memory and a restart
// identifies anew.
type SessionStore interface {
	// GatewaySession returns what SaveGatewaySession last kept for the
	// connector; nil when nothing.
	GatewaySession(connector string) ([]byte, error)
	// SaveGatewaySession keeps session durably, or forgets it when empty.
	SaveGatewaySession(connector string, session []byte) error
}

// keptSession is the session as it is stored: what a RESUME needs, and the
// bot's own user id, which READY gave and a RESUME does not repeat (own
// messages and mentions are told apart by it).
type keptSession struct {
	ID        string `json:"session_id"`
	ResumeURL string `json:"resume_gateway_url,omitempty"`
	Seq       int64  `json:"seq"`
	SelfID    string `json:"bot_user_id,omitempty"`
}

// sessionKeeper writes the latest session to its store in a goroutine of
// its own, so that the read loop never waits for a disk and a burst of
// events costs one write. What it wrote may lag behind the connection but
// never leads it: the sequence number passes a message only once the sink
// has stored that message, so a RESUME from a kept session replays at most
// events already handled, which intake's inbox deduplicates.
type sessionKeeper struct {
	store     SessionStore
	connector string
	log       *slog.Logger

	mu      sync.Mutex // guards latest; never held across a write
	latest  keptSession
	written keptSession // only the run goroutine touches it
	failing bool        // the last write failed (logged once until one succeeds)

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

func newSessionKeeper(store SessionStore, connector string, log *slog.Logger) *sessionKeeper {
	return &sessionKeeper{
		store: store, connector: connector, log: log,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// load returns the kept session; a zero one when there is none or it
// cannot be read (the connector then identifies, as after a first start).
func (k *sessionKeeper) load() keptSession {
	raw, err := k.store.GatewaySession(k.connector)
	if err != nil {
		k.log.Warn("cannot read the kept discord gateway session; identifying anew", "error", err)
		return keptSession{}
	}
	if len(raw) == 0 {
		return keptSession{}
	}
	var s keptSession
	if err := json.Unmarshal(raw, &s); err != nil || s.ID == "" {
		k.log.Warn("the kept discord gateway session is unreadable; identifying anew")
		return keptSession{}
	}
	k.latest, k.written = s, s
	return s
}

// note records s as the session to keep; an empty id forgets it.
func (k *sessionKeeper) note(s keptSession) {
	if s.ID == "" {
		s = keptSession{}
	}
	k.mu.Lock()
	changed := s != k.latest
	k.latest = s
	k.mu.Unlock()
	if changed {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// run writes what note recorded until close is called, then writes the
// last of it.
func (k *sessionKeeper) run() {
	defer close(k.done)
	for {
		select {
		case <-k.wake:
			k.flush()
		case <-k.stop:
			k.flush()
			return
		}
	}
}

// close stops run after its last write.
func (k *sessionKeeper) close() {
	close(k.stop)
	<-k.done
}

func (k *sessionKeeper) flush() {
	k.mu.Lock()
	s := k.latest
	k.mu.Unlock()
	if s == k.written {
		return
	}
	var raw []byte
	if s.ID != "" {
		raw, _ = json.Marshal(s) // plain strings and a number
	}
	if err := k.store.SaveGatewaySession(k.connector, raw); err != nil {
		if !k.failing {
			k.log.Warn("cannot keep the discord gateway session; a restart may resume from an older point or identify anew", "error", err)
		}
		k.failing = true
		return
	}
	k.failing = false
	k.written = s
}
