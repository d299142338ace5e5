package intake

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

// Submitter hands one message to the scheduler and returns its run id. The
// scheduler keys runs by msg.Key(), so submitting a message twice yields one
// run.
type Submitter interface {
	Submit(ctx context.Context, msg busapi.Submission) (runID string, err error)
}

// BatchSubmitter is a Submitter that also hands many messages over in one
// call (dev.berth.Scheduler1.SubmitBatch), queued in the order given.
type BatchSubmitter interface {
	Submitter
	// SubmitBatch returns each message's run id or, at the same index, why
	// it was not taken (an error that classifies like a failed Submit's).
	// err is for the call as a whole: none of the messages was taken.
	// errBatchUnsupported says the scheduler has no SubmitBatch.
	SubmitBatch(ctx context.Context, msgs []busapi.Submission) (runIDs []string, errs []error, err error)
}

// errBatchUnsupported is SubmitBatch's error from a scheduler that predates
// it: the messages go one Submit at a time.
var errBatchUnsupported = errors.New("the scheduler has no SubmitBatch")

// errBatchShort marks the hand-off span of a message a SubmitBatch answer
// had no result for.
var errBatchShort = errors.New("the scheduler's answer has no result for the message")

// BusSubmitter calls dev.berth.Scheduler1.Submit and SubmitBatch over D-Bus.
// Auto-start is allowed: the call starts the scheduler when it is not
// running.
type BusSubmitter struct {
	Conn *dbus.Conn
}

// SubmitBatch implements BatchSubmitter. The scheduler reports each refused
// message as "<D-Bus error name>: <text>"; it comes back as that dbus.Error,
// so that it classifies as the same Submit's error would.
func (b BusSubmitter) SubmitBatch(ctx context.Context, msgs []busapi.Submission) ([]string, []error, error) {
	runIDs, errs, err := busapi.NewScheduler(b.Conn).SubmitBatch(ctx, msgs)
	if err != nil {
		if bus.ErrorName(err) == "org.freedesktop.DBus.Error.UnknownMethod" {
			return nil, nil, errBatchUnsupported
		}
		return nil, nil, fmt.Errorf("cannot submit to %s: %w", bus.SchedulerName, err)
	}
	for i, e := range errs {
		if e != nil {
			errs[i] = fmt.Errorf("cannot submit to %s: %w", bus.SchedulerName, e)
		}
	}
	return runIDs, errs, nil
}

// Submit implements Submitter.
func (b BusSubmitter) Submit(ctx context.Context, msg busapi.Submission) (string, error) {
	runID, err := busapi.NewScheduler(b.Conn).Submit(ctx, msg)
	if err != nil {
		return "", fmt.Errorf("cannot submit to %s: %w", bus.SchedulerName, err)
	}
	return runID, nil
}

// submission is what the scheduler is handed for m.
func submission(m inboxEntry) busapi.Submission {
	return busapi.Submission{
		MessageID:   m.ID,
		Agent:       m.Agent,
		Connector:   m.Connector,
		Channel:     m.Channel,
		ChannelName: m.ChannelName,
		Thread:      m.Thread,
		Author:      m.Author,
		Text:        m.Text,
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
		return s.retryDelay.Max, true
	}
	for _, c := range connectors {
		l.poke(c)
	}
	return 0, false
}

// submitWindow is how many calls to the scheduler one connector's worker
// keeps in flight. The scheduler takes them concurrently and their marks
// in intake.db share commits, so a backlog drains at the speed of many
// calls, not one. One agent's messages go in order, one call after another
// (a SubmitBatch of up to maxBatch of them, or one Submit each), since the
// scheduler runs an agent's messages in the order it is given them: only
// different agents' calls overlap.
const submitWindow = 64

// maxBatch and maxBatchBytes bound one SubmitBatch: at most maxBatch of one
// agent's messages (the scheduler takes up to 512) and texts of at most
// maxBatchBytes in all, far below the bus's message size limit. A message
// larger than that goes alone.
const (
	maxBatch      = 256
	maxBatchBytes = 4 << 20
)

// batchRetryAfter is how long a lane goes one Submit at a time after the
// scheduler said it has no SubmitBatch (an older scheduler, until upgraded).
const batchRetryAfter = time.Minute

// readWindow is how many due messages one read of the pending index
// returns: enough that a backlog of many agents still makes batches of
// several messages each.
const readWindow = 1024

// forwardLane is one connector's retry state. It is kept in memory only: a
// failed Submit writes nothing, so a scheduler that stays down costs no
// fsync (the durable facts are "accepted" and "submitted"). After a restart
// every pending message is tried at once, which is what a restart is for.
type forwardLane struct {
	mu          sync.Mutex
	waiting     map[string]retryState // message key → its failed Submits
	failures    int                   // passes in a row in which no Submit got through
	pausedUntil time.Time
	noBatchTill time.Time // one Submit at a time until then (batchRetryAfter)
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

// agentChain orders one agent's calls within a pass: each waits until the
// scheduler has answered the one before it, and none is made once one
// before it failed.
type agentChain struct {
	done   chan struct{}
	failed bool // set before done is closed
	once   sync.Once
}

// release lets the agent's next call go (or fail, when failed).
func (c *agentChain) release(failed bool) {
	c.once.Do(func() {
		c.failed = failed
		close(c.done)
	})
}

// batchesOff reports whether the lane submits one message at a time for now.
func (l *forwardLane) batchesOff(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Before(l.noBatchTill)
}

func (l *forwardLane) turnBatchesOff(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noBatchTill = until
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
	st := l.waiting[busapi.MessageKey(connectorID, id)]
	return st.attempts, st.lastErr
}

// forwardConnector submits the pending messages of one connector that are
// due, oldest first, and returns when to pass again. Each agent's due
// messages go in batches of up to maxBatch, in order, one batch after
// another; up to submitWindow calls are in flight at a time. It reads the
// pending index a window at a time and skips messages that wait for a
// retry without reading them. When more Submits fail than succeed it stops
// starting new ones; when none got through (the scheduler is down) the
// whole lane pauses with back-off and its next pass starts again at the
// oldest message, so a pass reads only the few it tries.
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
		mu             sync.Mutex // guards succeeded, failedKeys
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
		due, last, end, err := s.store.dueMessages(connectorID, after, readWindow,
			func(key string) bool { return lane.notYet(key, now) })
		if err != nil {
			readErr = err
			break
		}
		after = last
		for _, batch := range agentBatches(due, blocked) {
			window <- struct{}{}
			if ctx.Err() != nil || tooManyFailures() {
				<-window
				stopped = true
				break read
			}
			agent := batch[0].Agent
			prev, cur := chains[agent], &agentChain{done: make(chan struct{})}
			chains[agent] = cur
			wg.Go(func() {
				defer func() { <-window }()
				if prev != nil {
					// prev holds a window slot of its own and was started
					// first, so this wait always ends.
					<-prev.done
					if prev.failed {
						cur.release(true) // stays pending, tried after prev
						return
					}
				}
				taken, failed := s.forwardBatch(ctx, box.Submitter, batch, lane, cur.release)
				mu.Lock()
				succeeded += taken
				failedKeys = append(failedKeys, failed...)
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
		return s.retryDelay.Max, true
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
		delay := s.retryDelay.Delay(lane.failures)
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

// agentBatches splits due messages (oldest first) into the batches they are
// submitted in: each holds one agent's messages in their order, at most
// maxBatch of them and maxBatchBytes of text. Messages of a blocked agent
// (one of its messages waits for a retry) are left out.
func agentBatches(due []inboxEntry, blocked map[string]bool) [][]inboxEntry {
	var (
		out   [][]inboxEntry
		open  = map[string]int{} // agent → index in out of its batch being filled
		bytes = map[string]int{}
	)
	for _, m := range due {
		if blocked[m.Agent] {
			continue
		}
		i, ok := open[m.Agent]
		if ok && (len(out[i]) == maxBatch || bytes[m.Agent]+len(m.Text) > maxBatchBytes) {
			ok = false
		}
		if !ok {
			out = append(out, nil)
			i = len(out) - 1
			open[m.Agent], bytes[m.Agent] = i, 0
		}
		out[i] = append(out[i], m)
		bytes[m.Agent] += len(m.Text)
	}
	return out
}

// forwardBatch hands one agent's messages (in order) to the scheduler and
// records each outcome: submitted, refused for good (with an error reply),
// or a retry in memory. It calls handedOn once the scheduler has answered,
// before the outcomes are recorded, so the agent's next batch need not wait
// for intake's commit; failed says the agent's later messages must wait. It
// returns how many messages the scheduler took (or refused for good) and
// the keys of those that wait for a retry.
func (s *Service) forwardBatch(ctx context.Context, sub Submitter, msgs []inboxEntry, lane *forwardLane, handedOn func(failed bool)) (taken int, retry []string) {
	bs, canBatch := sub.(BatchSubmitter)
	for _, m := range msgs {
		// Files travel with SubmitFiles, a refusal is answered here, a
		// decision goes to DecideApprovalFor: one
		// message at a time.
		canBatch = canBatch && len(m.Files) == 0 && m.Refusal == "" && m.Decision == nil
	}
	if canBatch && len(msgs) > 1 && !lane.batchesOff(s.clock.Now()) {
		subs := make([]busapi.Submission, len(msgs))
		spans := make([]handoff, len(msgs))
		for i, m := range msgs {
			spans[i] = startHandoff(ctx, m, lane.attempts(m.Key())+1)
			subs[i] = spans[i].sub
		}
		// Not cut short by shutdown: a finished call is recorded instead of
		// repeated after the restart.
		callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
		runIDs, errs, err := bs.SubmitBatch(callCtx, subs)
		cancel()
		for i, h := range spans {
			switch {
			case err != nil:
				h.end("", err)
			case i < len(runIDs) && i < len(errs):
				h.end(runIDs[i], errs[i])
			default:
				h.end("", errBatchShort)
			}
		}
		switch {
		case err == nil:
			mustWait := false
			for _, e := range errs {
				mustWait = mustWait || (e != nil && !submitCanNeverSucceed(e))
			}
			handedOn(mustWait)
			return s.recordBatch(msgs, runIDs, errs, lane)
		case errors.Is(err, errBatchUnsupported):
			s.log.Info("the scheduler has no SubmitBatch; submitting one message at a time", "connector", msgs[0].Connector)
			lane.turnBatchesOff(s.clock.Now().Add(batchRetryAfter))
		case submitCanNeverSucceed(err):
			// Something in the batch cannot cross the bus; one Submit each
			// finds which message it is and refuses only that one.
		default:
			handedOn(true)
			// The head of the agent's line waits for the retry; the rest
			// stay pending behind it, as after a failed Submit.
			m := msgs[0]
			attempts := lane.attempts(m.Key()) + 1
			delay := s.retryDelay.Delay(attempts)
			s.log.Warn("scheduler did not take messages; will retry", "connector", m.Connector, "agent", m.Agent,
				"message_id", m.ID, "messages", len(msgs), "attempts", attempts, "retry_in", delay, "err", err)
			lane.retry(m.Key(), m.Agent, attempts, s.clock.Now().Add(delay), err)
			return 0, []string{m.Key()}
		}
	}
	defer handedOn(false) // no-op once a failure released the chain
	for _, m := range msgs {
		if !s.forward(ctx, sub, m, lane) {
			handedOn(true) // the rest stay pending, tried after m
			return taken, []string{m.Key()}
		}
		taken++
	}
	return taken, nil
}

// recordBatch records the outcome of each message of an answered
// SubmitBatch; the marks of different messages share commits.
func (s *Service) recordBatch(msgs []inboxEntry, runIDs []string, errs []error, lane *forwardLane) (taken int, retry []string) {
	ok := make([]bool, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			attempts := lane.attempts(m.Key()) + 1
			ok[i] = s.record(m, lane, attempts, runIDs[i], errs[i])
		})
	}
	wg.Wait()
	for i, m := range msgs {
		if ok[i] {
			taken++
		} else {
			retry = append(retry, m.Key())
		}
	}
	return taken, retry
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

// forward submits one message and records the outcome (record). It
// reports whether the scheduler took it (or refused it for good).
func (s *Service) forward(ctx context.Context, sub Submitter, m inboxEntry, lane *forwardLane) bool {
	// The call is not cut short by shutdown: a finished Submit is recorded
	// instead of repeated after the restart.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	attempts := lane.attempts(m.Key()) + 1
	if m.Refusal != "" {
		return s.refuse(m, lane, attempts, errFilesRefused, "Sorry, berth could not take this message's files. "+m.Refusal)
	}
	if m.Decision != nil {
		return s.forwardDecision(ctx, sub, m, lane, attempts)
	}
	h := startHandoff(ctx, m, attempts)
	var runID string
	var err error
	if len(m.Files) > 0 {
		var files []busapi.File
		if files, err = s.openFiles(m); err != nil {
			// The files are gone (removed by hand, a disk error): the
			// message can never be handed on as it was accepted.
			return s.refuse(m, lane, attempts, err, "Sorry, berth lost this message's files before its run: "+err.Error())
		}
		h.sub.Files = files
		runID, err = sub.Submit(callCtx, h.sub)
		busapi.CloseFiles(files)
	} else {
		runID, err = sub.Submit(callCtx, h.sub)
	}
	h.end(runID, err)
	return s.record(m, lane, attempts, runID, err)
}

// errFilesRefused is the cause recorded for a message whose files were
// refused when it arrived.
var errFilesRefused = errors.New("its files were refused")

// record stores what the scheduler answered for m: submitted with its run
// id, refused for good (with an error reply), or a retry in memory. It
// reports whether the scheduler took it (or refused it for good).
func (s *Service) record(m inboxEntry, lane *forwardLane, attempts int, runID string, err error) bool {
	key := m.Key()
	log := s.log.With("connector", m.Connector, "message_id", m.ID, "agent", m.Agent)
	now := s.clock.Now()
	if err != nil && submitCanNeverSucceed(err) {
		// Retrying cannot help (its agent was removed from the config, a
		// field the bus cannot carry): tell the sender instead.
		log.Error("scheduler cannot take this message, ever; sending an error reply", "err", err)
		return s.refuse(m, lane, attempts, err, "Sorry, berth could not run this message.")
	}
	if err != nil {
		delay := s.retryDelay.Delay(attempts)
		log.Warn("scheduler did not take message; will retry", "attempts", attempts, "retry_in", delay, "err", err)
		s.countRetry(m)
		lane.retry(key, m.Agent, attempts, now.Add(delay), err)
		return false
	}
	if err := s.store.markSubmitted(key, runID, attempts, now); err != nil {
		// The scheduler has the run; a retry returns the same run id.
		log.Error("cannot record submitted message", "run_id", runID, "err", err)
		lane.retry(key, m.Agent, attempts, now.Add(s.retryDelay.Delay(1)), err)
		return false
	}
	s.dropFiles(m)
	lane.forget(key)
	s.countHandoff(m, "submitted", now)
	log.Info("message submitted", "run_id", runID)
	s.refreshCounters()
	s.startTyping(m)
	s.startProgress(m, runID)
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

// refuse records that m is never handed on and queues its sender's error
// reply (text, and the cause as the reply's error), in one commit. It
// reports whether that was recorded.
func (s *Service) refuse(m inboxEntry, lane *forwardLane, attempts int, cause error, text string) bool {
	key, now := m.Key(), s.clock.Now()
	reply := outboxEntry{
		RunID:     "refused-" + key,
		MessageID: m.ID,
		Connector: m.Connector,
		Agent:     m.Agent,
		Channel:   m.Channel,
		Thread:    m.Thread,
		Meta:      replyMeta(m),
		RunState:  "failed",
		Text:      bus.Text(text),
		Error:     bus.Text(dbusErrorText(cause)),
	}
	if serr := s.store.refuseMessage(key, cause, reply, attempts, now); serr != nil {
		s.log.Error("cannot record refused message", "connector", m.Connector, "message_id", m.ID, "err", serr)
		lane.retry(key, m.Agent, attempts, now.Add(s.retryDelay.Delay(attempts)), serr)
		return false
	}
	s.dropFiles(m)
	lane.forget(key)
	s.countHandoff(m, "refused", now)
	s.refreshCounters()
	s.pokeDeliver(m.Connector)
	return true
}
