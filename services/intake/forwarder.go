package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
)

// Submitter hands one message to the scheduler and returns its run id. msg
// has the keys of dev.berth.Scheduler1.Submit; msg["id"] is the idempotency
// key, so submitting a message twice yields one run.
type Submitter interface {
	Submit(ctx context.Context, msg map[string]string) (runID string, err error)
}

// BusSubmitter calls dev.berth.Scheduler1.Submit over D-Bus. Auto-start is
// allowed: the call starts the scheduler when it is not running.
type BusSubmitter struct {
	Conn *dbus.Conn
}

// Submit implements Submitter.
func (b BusSubmitter) Submit(ctx context.Context, msg map[string]string) (string, error) {
	var runID string
	obj := b.Conn.Object(bus.SchedulerName, bus.SchedulerPath)
	if err := obj.CallWithContext(ctx, bus.SchedulerInterface+".Submit", 0, msg).Store(&runID); err != nil {
		return "", fmt.Errorf("cannot submit to %s: %w", bus.SchedulerName, err)
	}
	if runID == "" {
		return "", fmt.Errorf("cannot submit to %s: empty run id", bus.SchedulerName)
	}
	return runID, nil
}

// submission is the Submit argument for m.
func submission(m inboxEntry) map[string]string {
	return map[string]string{
		"id":           m.Key(),
		"agent":        m.Agent,
		"connector":    m.Connector,
		"channel":      m.Channel,
		"channel_name": m.ChannelName,
		"thread":       m.Thread,
		"author":       m.Author,
		"text":         m.Text,
	}
}

// forwardPass is the forward loop's pass: it makes sure every connector
// with pending messages has its worker, and wakes them. It does no I/O but
// reading the pending index, so it passes even while a Submit hangs.
func (s *Service) forwardPass(context.Context) (time.Duration, bool) {
	l := s.forwardOn.Load()
	if l == nil || s.submitter.Load() == nil {
		return 0, false // Export or WithSubmitter wakes us.
	}
	connectors, err := s.store.connectorsWithPending(inboxQueue)
	if err != nil {
		s.log.Error("cannot forward messages", "err", err)
		return s.backoff.max, true
	}
	for _, c := range connectors {
		l.poke(c)
	}
	return 0, false
}

// forwardConnector submits every pending message of one connector that is
// due and returns when the next one is due. Retry times live in memory:
// after a restart every pending message is tried at once, which is what a
// restart is for.
func (s *Service) forwardConnector(ctx context.Context, connectorID string) (time.Duration, bool) {
	box := s.submitter.Load()
	if box == nil {
		return 0, false
	}
	pending, err := s.store.pendingMessagesOf(connectorID)
	if err != nil {
		s.log.Error("cannot forward messages", "connector", connectorID, "err", err)
		return s.backoff.max, true
	}
	var next time.Time
	for _, m := range pending {
		if ctx.Err() != nil {
			return 0, false
		}
		key := m.Key()
		if due, ok := s.notBefore.Load(key); ok && s.clock.Now().Before(due.(time.Time)) {
			next = earliest(next, due.(time.Time))
			continue
		}
		due, retry := s.forward(ctx, box.Submitter, m)
		if retry {
			s.notBefore.Store(key, due)
			next = earliest(next, due)
		} else {
			s.notBefore.Delete(key)
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return max(next.Sub(s.clock.Now()), 0), true
}

// submitCanNeverSucceed reports whether a Submit error is the same on every
// retry: the scheduler refused the message (InvalidArgument), the bus refused
// its arguments, or it cannot be encoded at all (a NUL or invalid UTF-8 in a
// string, a message too long for the bus).
func submitCanNeverSucceed(err error) bool {
	switch bus.ErrorName(err) {
	case bus.ErrInvalidArgument, "org.freedesktop.DBus.Error.InvalidArgs",
		"org.freedesktop.DBus.Error.InconsistentMessage", "org.freedesktop.DBus.Error.LimitsExceeded":
		return true
	}
	if _, ok := errors.AsType[dbus.FormatError](err); ok {
		return true
	}
	if _, ok := errors.AsType[dbus.InvalidMessageError](err); ok {
		return true
	}
	return false
}

// forward submits one message and reports when to retry it if that failed.
func (s *Service) forward(ctx context.Context, sub Submitter, m inboxEntry) (time.Time, bool) {
	// The call is not cut short by shutdown: a finished Submit is recorded
	// instead of repeated after the restart.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	log := s.log.With("connector", m.Connector, "message_id", m.ID, "agent", m.Agent)
	runID, err := sub.Submit(callCtx, submission(m))
	now := s.clock.Now()
	if err != nil && submitCanNeverSucceed(err) {
		// Retrying cannot help (its agent was removed from the config, a
		// field the bus cannot carry): tell the sender instead.
		log.Error("scheduler cannot take this message, ever; sending an error reply", "err", err)
		reply := outboxEntry{
			RunID:     "refused-" + m.Key(),
			MessageID: m.ID,
			Connector: m.Connector,
			Agent:     m.Agent,
			Channel:   m.Channel,
			Thread:    m.Thread,
			Meta:      replyMeta(m),
			RunState:  "failed",
			Text:      "Sorry, berth could not run this message.",
			Error:     validText(dbusErrorText(err)),
		}
		if err := s.store.refuseMessage(m.Key(), err, reply, now); err != nil {
			log.Error("cannot record refused message", "err", err)
			return now.Add(s.backoff.delay(m.Attempts + 1)), true
		}
		s.refreshCounters()
		s.pokeDeliver(m.Connector)
		return time.Time{}, false
	}
	if err != nil {
		attempts := m.Attempts + 1
		delay := s.backoff.delay(attempts)
		log.Warn("scheduler did not take message; will retry", "attempts", attempts, "retry_in", delay, "err", err)
		if err := s.store.recordSubmitFailure(m.Key(), err, now); err != nil {
			log.Error("cannot record failed submit", "err", err)
		}
		return now.Add(delay), true
	}
	if err := s.store.markSubmitted(m.Key(), runID, now); err != nil {
		// The scheduler has the run; a retry returns the same run id.
		log.Error("cannot record submitted message", "run_id", runID, "err", err)
		return now.Add(s.backoff.delay(1)), true
	}
	log.Info("message submitted", "run_id", runID)
	s.refreshCounters()
	s.startTyping(m)
	return time.Time{}, false
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// dbusErrorText is the human part of a D-Bus error.
func dbusErrorText(err error) string {
	var de dbus.Error
	if errors.As(err, &de) && len(de.Body) > 0 {
		if msg, ok := de.Body[0].(string); ok {
			return msg
		}
	}
	return err.Error()
}
