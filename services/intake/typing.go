package intake

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

const (
	// typingEvery is how often "typing" is shown again while a run is in
	// progress (platforms let the indicator lapse after 5-10 s).
	typingEvery = 8 * time.Second
	// typingFor stops showing it for a run that takes longer.
	typingFor = 10 * time.Minute
	// typingTimeout bounds each Typing call.
	typingTimeout = 5 * time.Second
)

// typingSet holds the messages handed to the scheduler whose reply has not
// arrived yet, for connectors that can show "typing". It is in memory only:
// after a restart nobody is shown typing, which is harmless.
type typingSet struct {
	mu      sync.Mutex
	entries map[string]*typingEntry // by message key
}

type typingEntry struct {
	connector, channel string
	meta               map[string]string
	since              time.Time
	inFlight           bool
}

// startTyping shows "typing" for m at once and then every typingEvery until
// its reply is delivered to intake (stopTyping), when its connector can.
func (s *Service) startTyping(m inboxEntry) {
	rc, ok := s.connectorByID(m.Connector)
	if !ok || rc.conn == nil {
		return
	}
	if _, ok := rc.conn.(connector.Typer); !ok || !s.showsTyping(m.Connector) {
		return
	}
	e := &typingEntry{connector: m.Connector, channel: m.Channel, meta: replyMeta(m), since: s.clock.Now()}
	s.typing.mu.Lock()
	if s.typing.entries == nil {
		s.typing.entries = map[string]*typingEntry{}
	}
	s.typing.entries[m.Key()] = e
	s.typing.mu.Unlock()
	s.showTyping(m.Key(), e)
}

func (s *Service) stopTyping(key string) {
	s.typing.mu.Lock()
	delete(s.typing.entries, key)
	s.typing.mu.Unlock()
}

// showTyping calls Typing in the background, one call per message at a time.
func (s *Service) showTyping(key string, e *typingEntry) {
	s.typing.mu.Lock()
	if e.inFlight {
		s.typing.mu.Unlock()
		return
	}
	e.inFlight = true
	meta := maps.Clone(e.meta)
	s.typing.mu.Unlock()
	go func() {
		defer func() {
			s.typing.mu.Lock()
			e.inFlight = false
			s.typing.mu.Unlock()
		}()
		rc, ok := s.connectorByID(e.connector)
		if !ok || rc.conn == nil {
			return
		}
		t, ok := rc.conn.(connector.Typer)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), typingTimeout)
		defer cancel()
		if err := t.Typing(ctx, e.channel, meta); err != nil {
			s.log.Debug("cannot show typing", "connector", e.connector, "message_id", key, "err", redact(err.Error(), rc.secrets))
		}
	}()
}

// typingLoop shows "typing" again every typingEvery for each run in
// progress, and gives up on runs older than typingFor.
func (s *Service) typingLoop(ctx context.Context) {
	for {
		next := s.clock.After(typingEvery)
		s.notePass("typing", nil)
		select {
		case <-ctx.Done():
			return
		case <-next:
		}
		now := s.clock.Now()
		s.typing.mu.Lock()
		due := map[string]*typingEntry{}
		for key, e := range s.typing.entries {
			if now.Sub(e.since) > typingFor {
				delete(s.typing.entries, key)
				continue
			}
			due[key] = e
		}
		s.typing.mu.Unlock()
		for key, e := range due {
			s.showTyping(key, e)
		}
	}
}
