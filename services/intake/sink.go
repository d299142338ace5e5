package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Accept implements connector.Sink: it stores m in the inbox (fsynced) and
// returns nil, or returns nil for a message it already has (a redelivery)
// or can never take (no route, a bad id): all three may be acknowledged to
// the platform. It returns an error only when nothing was stored and the
// platform should deliver the event again.
//
// Routing: a binding's channel_id, then its channel_name glob, then its
// server_id, then the connector's default agent, then [intake] default_agent.
func (s *Service) Accept(ctx context.Context, m connector.Message) error {
	log := s.log.With("connector", m.Connector, "message_id", m.ID)
	ctx, span := startReceive(ctx, m.Connector, "")
	defer span.End()
	r, ok := s.connectorByID(m.Connector)
	if !ok {
		log.Warn("message from a connector that is not configured dropped")
		s.countRefused(m.Connector, refusedUnknownConnector)
		return nil
	}
	if w, ok := r.conn.(*webhookConnector); ok {
		w.noteEvent(s.clock.Now())
	}
	if err := validID(m.ID); err != nil {
		log.Warn("message with an unusable id dropped", "err", err)
		s.countRefused(m.Connector, refusedBadID)
		return nil
	}
	m = validMessage(m)

	if prior, found, err := s.store.message(m.Connector, m.ID); err != nil {
		return fmt.Errorf("cannot look up message: %w", err)
	} else if found {
		log.Info("duplicate message acknowledged", "agent", prior.Agent, "run_id", prior.RunID)
		s.countDuplicate(m.Connector)
		return nil
	}
	agent, err := s.config().RouteMessage(m.Connector, m.Channel, m.ChannelName, m.Server)
	if err == nil && agent == "" {
		err = errors.New("no agent")
	}
	if err != nil {
		// Retrying cannot find a route the config does not have.
		log.Warn("message has no route; acknowledged and dropped", "channel", m.Channel, "err", err)
		s.countRefused(m.Connector, refusedNoRoute)
		return nil
	}
	entry := inboxEntry{
		Connector:    m.Connector,
		ID:           m.ID,
		Channel:      m.Channel,
		ChannelName:  m.ChannelName,
		Server:       m.Server,
		Thread:       m.Thread,
		Author:       m.Author,
		AuthorID:     m.AuthorID,
		AuthorGroups: slices.Clone(m.AuthorGroups),
		Text:         m.Text,
		Meta:         maps.Clone(m.Meta),
		Agent:        agent,
		ReceivedAt:   s.clock.Now().UTC(),
		Decision:     decisionOf(m),
	}
	log = log.With("agent", agent)
	if entry.Decision != nil {
		// A decision runs nothing: its files are not taken.
		m.Files = nil
	}
	if entry.Files, entry.Refusal, err = s.takeAttachments(ctx, r.conn, entry.Key(), m.Files); err != nil {
		log.Warn("message's files could not be downloaded; nothing stored, the platform delivers it again", "files", len(m.Files), "err", err)
		return fmt.Errorf("cannot take the message's files: %w", err)
	}
	if entry.Refusal != "" {
		log.Info("message's files refused; it runs nothing and gets a reply", "reason", entry.Refusal)
	}
	return s.keepTraced(ctx, func(e inboxEntry) error { return s.keep(log, e) }, entry)
}

// keep stores an accepted message (fsynced) and wakes its connector's
// forwarder.
func (s *Service) keep(log *slog.Logger, entry inboxEntry) error {
	_, created, err := s.store.accept(entry)
	if err != nil {
		return err
	}
	if !created {
		log.Info("duplicate message acknowledged")
		s.countDuplicate(entry.Connector)
		return nil
	}
	log.Info("message accepted")
	s.countAccepted(entry.Connector)
	log.Debug("message text", "author", entry.Author, "text", entry.Text)
	s.refreshCounters()
	if l := s.forwardOn.Load(); l != nil {
		l.poke(entry.Connector)
	}
	return nil
}

// validMessage makes every text field of m valid for the store and the bus:
// invalid UTF-8 and NUL characters (which D-Bus strings cannot carry) become
// U+FFFD. Platforms send what their users typed; refusing it would lose it.
func validMessage(m connector.Message) connector.Message {
	for _, f := range []*string{&m.Channel, &m.ChannelName, &m.Server, &m.Thread, &m.Author, &m.AuthorID, &m.Text} {
		*f = bus.Text(*f)
	}
	if len(m.Meta) > 0 {
		meta := make(map[string]string, len(m.Meta))
		for k, v := range m.Meta {
			meta[bus.Text(k)] = bus.Text(v)
		}
		m.Meta = meta
	}
	return m
}

// checkText refuses a field that holds NUL or invalid UTF-8, naming it.
func checkText(field, value string) error {
	if !utf8.ValidString(value) {
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	if i := strings.IndexByte(value, 0); i >= 0 {
		return fmt.Errorf("%s contains a NUL character at byte %d", field, i)
	}
	return nil
}
