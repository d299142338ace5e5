package intake

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// submitWindow is how many Submits one connector's worker keeps in flight.
// The scheduler takes them concurrently and their marks in intake.db share
// commits, so a backlog drains at the speed of many Submits, not one. The
// Submits of one agent are made one after another, in the order the
// messages arrived, since the scheduler runs an agent's messages in the
// order it is given them: only different agents' messages overlap.
const submitWindow = 64

// readWindow is how many due messages one read of the pending index returns.
const readWindow = 256

// forwardLane is one connector's retry state. It is kept in memory only: a
// failed Submit writes nothing, so a scheduler that stays down costs no
// fsync (the durable facts are "accepted" and "submitted"). After a restart
// every pending message is tried at once, which is what a restart is for.
type forwardLane struct {
	mu          sync.Mutex
	waiting     map[string]retryState // message key → its failed Submits
	failures    int                   // passes in a row in which no Submit got through
	pausedUntil time.Time
}

type retryState struct {
	agent    string // the message's agent: its later messages wait behind it
	attempts int
	due      time.Time // zero: due at the lane's next pass
	lastErr  string
}

func (s *Service) forwardLaneOf(connectorID string) *forwardLane {
	if l, ok := s.forwardLanes.Load(connectorID); ok {
		return l.(*forwardLane)
	}
	l, _ := s.forwardLanes.LoadOrStore(connectorID, &forwardLane{waiting: map[string]retryState{}})
	return l.(*forwardLane)
}

// notYet reports whether key waits for a retry due after now.
func (l *forwardLane) notYet(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.waiting[key]
	return ok && now.Before(st.due)
}

func (l *forwardLane) attempts(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting[key].attempts
}

func (l *forwardLane) retry(key, agent string, attempts int, due time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiting[key] = retryState{agent: agent, attempts: attempts, due: due, lastErr: err.Error()}
}

// blockedAgents are the agents with a message waiting for a retry due after
// now: their later messages must not overtake it.
func (l *forwardLane) blockedAgents(now time.Time) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	blocked := map[string]bool{}
	for _, st := range l.waiting {
		if now.Before(st.due) {
			blocked[st.agent] = true
		}
	}
	return blocked
}

// agentChain orders one agent's Submits within a pass: each waits for the
// one before it, and none is made once one before it failed.
type agentChain struct {
	done   chan struct{}
	failed bool // set before done is closed
}

func (l *forwardLane) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.waiting, key)
}

// submitFailures returns how many Submits of a pending message have failed
// and the last error.
func (s *Service) submitFailures(connectorID, id string) (int, string) {
	l := s.forwardLaneOf(connectorID)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.waiting[messageKey(connectorID, id)]
	return st.attempts, st.lastErr
}

// forwardConnector submits the pending messages of one connector that are
// due, oldest first, up to submitWindow at a time, and returns when to pass
// again. It reads the pending index a window at a time and skips messages
// that wait for a retry without reading them. When more Submits fail than
// succeed it stops starting new ones; when none got through (the scheduler
// is down) the whole lane pauses with back-off and its next pass starts
// again at the oldest message, so a pass reads only the few it tries.
func (s *Service) forwardConnector(ctx context.Context, connectorID string) (time.Duration, bool) {
	box := s.submitter.Load()
	if box == nil {
		return 0, false
	}
	lane := s.forwardLaneOf(connectorID)
	lane.mu.Lock()
	paused := lane.pausedUntil
	lane.mu.Unlock()
	if now := s.clock.Now(); now.Before(paused) {
		return paused.Sub(now), true
	}

	var (
		wg             sync.WaitGroup
		window         = make(chan struct{}, s.submitWindow)
		mu             sync.Mutex // guards succeeded, failed, failedKeys
		succeeded      int
		failedKeys     []string
		after          []byte
		stopped, ended bool
		readErr        error
	)
	tooManyFailures := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failedKeys) > succeeded
	}
	chains := map[string]*agentChain{}
	blocked := lane.blockedAgents(s.clock.Now())
read:
	for ctx.Err() == nil {
		now := s.clock.Now()
		batch, last, end, err := s.store.dueMessages(connectorID, after, readWindow,
			func(key string) bool { return lane.notYet(key, now) })
		if err != nil {
			readErr = err
			break
		}
		after = last
		for _, m := range batch {
			if blocked[m.Agent] {
				continue // behind a message of its agent that waits for a retry
			}
			window <- struct{}{}
			if ctx.Err() != nil || tooManyFailures() {
				<-window
				stopped = true
				break read
			}
			prev, cur := chains[m.Agent], &agentChain{done: make(chan struct{})}
			chains[m.Agent] = cur
			wg.Go(func() {
				defer func() { <-window }()
				defer close(cur.done)
				if prev != nil {
					// prev holds a window slot of its own and was started
					// first, so this wait always ends.
					<-prev.done
					if prev.failed {
						cur.failed = true // stays pending, tried after prev
						return
					}
				}
				ok := s.forward(ctx, box.Submitter, m, lane)
				cur.failed = !ok
				mu.Lock()
				if ok {
					succeeded++
				} else {
					failedKeys = append(failedKeys, m.Key())
				}
				mu.Unlock()
			})
		}
		if end {
			ended = true
			break
		}
	}
	wg.Wait()
	if readErr != nil {
		s.log.Error("cannot forward messages", "connector", connectorID, "err", readErr)
		return s.backoff.max, true
	}

	now := s.clock.Now()
	lane.mu.Lock()
	defer lane.mu.Unlock()
	if succeeded == 0 && len(failedKeys) > 0 {
		// Nothing got through: pause the lane and start at the oldest
		// message again, instead of trying every message on its own timer.
		lane.failures++
		for _, key := range failedKeys {
			if st, ok := lane.waiting[key]; ok {
				st.due = time.Time{}
				lane.waiting[key] = st
			}
		}
		delay := s.backoff.delay(lane.failures)
		lane.pausedUntil = now.Add(delay)
		return delay, true
	}
	lane.failures, lane.pausedUntil = 0, time.Time{}
	if ctx.Err() != nil {
		return 0, false
	}
	if stopped || !ended {
		return 0, true // pass again at once for the rest
	}
	var next time.Time
	for _, st := range lane.waiting {
		if !st.due.IsZero() {
			next = earliest(next, st.due)
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return max(next.Sub(now), 0), true
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

// forward submits one message and records the outcome: submitted, refused
// for good (with an error reply), or a retry in memory. It reports whether
// the scheduler took it (or refused it for good).
func (s *Service) forward(ctx context.Context, sub Submitter, m inboxEntry, lane *forwardLane) bool {
	// The call is not cut short by shutdown: a finished Submit is recorded
	// instead of repeated after the restart.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	key := m.Key()
	attempts := lane.attempts(key) + 1
	log := s.log.With("connector", m.Connector, "message_id", m.ID, "agent", m.Agent)
	runID, err := sub.Submit(callCtx, submission(m))
	now := s.clock.Now()
	if err != nil && submitCanNeverSucceed(err) {
		// Retrying cannot help (its agent was removed from the config, a
		// field the bus cannot carry): tell the sender instead.
		log.Error("scheduler cannot take this message, ever; sending an error reply", "err", err)
		reply := outboxEntry{
			RunID:     "refused-" + key,
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
		if serr := s.store.refuseMessage(key, err, reply, attempts, now); serr != nil {
			log.Error("cannot record refused message", "err", serr)
			lane.retry(key, m.Agent, attempts, now.Add(s.backoff.delay(attempts)), serr)
			return false
		}
		lane.forget(key)
		s.refreshCounters()
		s.pokeDeliver(m.Connector)
		return true
	}
	if err != nil {
		delay := s.backoff.delay(attempts)
		log.Warn("scheduler did not take message; will retry", "attempts", attempts, "retry_in", delay, "err", err)
		lane.retry(key, m.Agent, attempts, now.Add(delay), err)
		return false
	}
	if err := s.store.markSubmitted(key, runID, attempts, now); err != nil {
		// The scheduler has the run; a retry returns the same run id.
		log.Error("cannot record submitted message", "run_id", runID, "err", err)
		lane.retry(key, m.Agent, attempts, now.Add(s.backoff.delay(1)), err)
		return false
	}
	lane.forget(key)
	log.Info("message submitted", "run_id", runID)
	s.refreshCounters()
	s.startTyping(m)
	return true
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
