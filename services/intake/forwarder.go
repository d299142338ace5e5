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

func (s *Service) forwardLoop(ctx context.Context) {
	// Retry times live in memory: after a restart every pending message is
	// tried at once, which is what a restart is for.
	notBefore := map[string]time.Time{}
	runLoop(ctx, s.wakeForward, func(ctx context.Context) (time.Duration, bool) {
		return s.forwardPass(ctx, notBefore)
	})
}

// forwardPass submits every pending message that is due and returns when the
// next one is due.
func (s *Service) forwardPass(ctx context.Context, notBefore map[string]time.Time) (time.Duration, bool) {
	box := s.submitter.Load()
	if box == nil {
		return 0, false // Export or WithSubmitter wakes us.
	}
	pending, err := s.store.pendingMessages()
	if err != nil {
		s.log.Error("cannot forward messages", "err", err)
		return s.backoff.max, true
	}
	var next time.Time
	stillPending := make(map[string]bool, len(pending))
	for _, m := range pending {
		if ctx.Err() != nil {
			return 0, false
		}
		key := m.Key()
		stillPending[key] = true
		if due := notBefore[key]; s.now().Before(due) {
			next = earliest(next, due)
			continue
		}
		due, retry := s.forward(ctx, box.Submitter, m)
		if retry {
			notBefore[key] = due
			next = earliest(next, due)
		} else {
			delete(notBefore, key)
		}
	}
	for key := range notBefore {
		if !stillPending[key] {
			delete(notBefore, key)
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return max(time.Until(next), 0), true
}

// forward submits one message and reports when to retry it if that failed.
func (s *Service) forward(ctx context.Context, sub Submitter, m inboxEntry) (time.Time, bool) {
	// The call is not cut short by shutdown: a finished Submit is recorded
	// instead of repeated after the restart.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	log := s.log.With("connector", m.Connector, "message_id", m.ID, "agent", m.Agent)
	runID, err := sub.Submit(callCtx, submission(m))
	if bus.ErrorName(err) == bus.ErrInvalidArgument {
		// Retrying cannot help (say, its agent was removed from the config):
		// tell the sender instead of retrying forever.
		log.Error("scheduler refused message for good; sending an error reply", "err", err)
		reply := outboxEntry{
			RunID:     "refused-" + m.Key(),
			MessageID: m.ID,
			Connector: m.Connector,
			Agent:     m.Agent,
			Channel:   m.Channel,
			Thread:    m.Thread,
			RunState:  "failed",
			Text:      "Sorry, berth could not run this message.",
			Error:     dbusErrorText(err),
		}
		if err := s.store.refuseMessage(m.Key(), err, reply); err != nil {
			log.Error("cannot record refused message", "err", err)
			return s.now().Add(s.backoff.delay(m.Attempts + 1)), true
		}
		s.refreshCounters()
		wake(s.wakeDeliver)
		return time.Time{}, false
	}
	if err != nil {
		attempts := m.Attempts + 1
		delay := s.backoff.delay(attempts)
		log.Warn("scheduler did not take message; will retry", "attempts", attempts, "retry_in", delay, "err", err)
		if err := s.store.recordSubmitFailure(m.Key(), err); err != nil {
			log.Error("cannot record failed submit", "err", err)
		}
		return s.now().Add(delay), true
	}
	if err := s.store.markSubmitted(m.Key(), runID); err != nil {
		// The scheduler has the run; a retry returns the same run id.
		log.Error("cannot record submitted message", "run_id", runID, "err", err)
		return s.now().Add(s.backoff.delay(1)), true
	}
	log.Info("message submitted", "run_id", runID)
	s.refreshCounters()
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
