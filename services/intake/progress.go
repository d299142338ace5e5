package intake

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Live progress and reactions (docs/adr/0027-live-progress.md).
//
// A message handed to its agent gets 👀 (reactions = true). With progress =
// "edit", the run's first RunProgress signal posts one progress message in
// the conversation, later ones edit it in place, at most once per the
// platform's ProgressLimits.Every (the latest text wins), and once the
// reply is posted — as a new message, through the reply path and its
// protection against doubles — the progress message is deleted and the
// message gets ✅ or ❌. The progress message's id is kept with the message
// in intake.db, so an intake restarted mid-run still deletes it: nothing
// is posted twice, the answer is never an edit that a crash could lose.

const (
	// progressCallTimeout bounds each call about a progress message or a
	// reaction.
	progressCallTimeout = 10 * time.Second
	// progressFor forgets the progress of a run whose reply has not come
	// after this long (the scheduler's run timeouts are far shorter).
	progressFor = 6 * time.Hour
	// progressTextDefault caps a text when a platform gives no MaxText.
	progressTextDefault = 200
	// progressDeleteAttempts bounds the deletes of one progress message,
	// retried with the reply back-off; a restart tries once more.
	progressDeleteAttempts = 5
)

// progressBoard holds the progress messages of runs in progress, by
// message key. In memory; the platform id of a posted one is also in the
// message's inbox entry.
type progressBoard struct {
	mu      sync.Mutex
	entries map[string]*progressEntry
	// reacting counts reactions under way (each bounded by
	// progressCallTimeout), so a test can tell none is left to come.
	reacting sync.WaitGroup
	// early holds the latest RunProgress of a message whose hand-off is
	// not recorded yet: a run can report its first tool call before
	// Submit's answer is committed, and a run with one tool call has no
	// second report. startProgress takes it.
	early map[string]earlyProgress
}

type earlyProgress struct {
	p  busapi.RunProgress
	at time.Time
}

const (
	// earlyMax bounds the reports kept for messages not yet started;
	// earlyFor is how long one is kept (the hand-off's commit is far
	// quicker).
	earlyMax = 1024
	earlyFor = time.Minute
)

type progressEntry struct {
	key, connector, runID string
	since                 time.Time
	msg                   connector.ProgressMessage // msg.ID once posted
	want                  string                    // the latest text asked for
	seq                   uint32
	shown                 string // the text on the platform
	lastCall              time.Time
	inFlight              bool
	timer                 clockwork.Timer
	done                  bool // the reply is posted: no more calls but a delete
}

// progressOf is the connector's [connectors] progress and reactions.
func progressOf(rc *running) (mode string, reactions bool) {
	if rc == nil {
		return config.ProgressOff, false
	}
	// A config made in code may leave it unset: typing, as before.
	return rc.cfg.Progress, rc.cfg.Reactions
}

// showsTyping tells whether a message of connectorID shows "typing" while
// its run is in progress.
func (s *Service) showsTyping(connectorID string) bool {
	rc, _ := s.connectorByID(connectorID)
	mode, _ := progressOf(rc)
	return mode != config.ProgressOff
}

// startProgress is called once m was handed to the scheduler as run runID.
func (s *Service) startProgress(m inboxEntry, runID string) {
	rc, ok := s.connectorByID(m.Connector)
	if !ok || rc.conn == nil {
		return
	}
	mode, reactions := progressOf(rc)
	if reactions {
		s.react(rc, connector.Reaction{MessageID: m.ID, Channel: m.Channel, Meta: replyMeta(m), Status: connector.ReactionAccepted})
	}
	s.progress.mu.Lock()
	early, hadEarly := s.progress.early[m.Key()]
	delete(s.progress.early, m.Key())
	s.progress.mu.Unlock()
	if _, ok := rc.conn.(connector.ProgressEditor); !ok || mode != config.ProgressEdit {
		return
	}
	now := s.clock.Now()
	e := &progressEntry{key: m.Key(), connector: m.Connector, runID: runID, since: now,
		msg: connector.ProgressMessage{MessageID: m.ID, Channel: m.Channel, Thread: m.Thread, Meta: replyMeta(m)}}
	s.progress.mu.Lock()
	defer s.progress.mu.Unlock()
	if s.progress.entries == nil {
		s.progress.entries = map[string]*progressEntry{}
	}
	for key, old := range s.progress.entries {
		if now.Sub(old.since) > progressFor {
			s.dropProgressLocked(key, old)
		}
	}
	if old, ok := s.progress.entries[e.key]; ok {
		s.dropProgressLocked(e.key, old)
	}
	s.progress.entries[e.key] = e
	if hadEarly && early.p.RunID == runID {
		e.seq, e.want = early.p.Seq, early.p.Text
		s.kickProgressLocked(e)
	}
}

// keepEarlyLocked keeps p for its message's startProgress, the latest
// report of each message, within earlyMax and earlyFor.
func (s *Service) keepEarlyLocked(p busapi.RunProgress) {
	now := s.clock.Now()
	if s.progress.early == nil {
		s.progress.early = map[string]earlyProgress{}
	}
	if old, ok := s.progress.early[p.MessageKey]; ok && old.p.RunID == p.RunID && old.p.Seq >= p.Seq {
		return
	}
	if len(s.progress.early) >= earlyMax {
		for k, old := range s.progress.early {
			if now.Sub(old.at) > earlyFor {
				delete(s.progress.early, k)
			}
		}
		if _, ok := s.progress.early[p.MessageKey]; !ok && len(s.progress.early) >= earlyMax {
			return // a run of another intake's hand-off, most likely: nobody shows it
		}
	}
	s.progress.early[p.MessageKey] = earlyProgress{p: p, at: now}
}

func (s *Service) dropProgressLocked(key string, e *progressEntry) {
	e.done = true
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	delete(s.progress.entries, key)
}

// watchRunProgress passes the scheduler's RunProgress signals on conn to
// their messages' progress, until conn closes.
func (s *Service) watchRunProgress(conn *dbus.Conn) {
	signals := busapi.WatchRunProgress(conn.Context(), conn)
	go func() {
		for p := range signals {
			s.onRunProgress(p)
		}
	}()
}

// onRunProgress takes one RunProgress: the text the run's progress message
// should say now.
func (s *Service) onRunProgress(p busapi.RunProgress) {
	s.progress.mu.Lock()
	defer s.progress.mu.Unlock()
	e, ok := s.progress.entries[p.MessageKey]
	if !ok && p.Text != "" {
		s.keepEarlyLocked(p)
		return
	}
	if !ok || e.done || (e.runID != "" && e.runID != p.RunID) || p.Seq <= e.seq || p.Text == "" {
		return
	}
	e.seq, e.want = p.Seq, p.Text
	s.kickProgressLocked(e)
}

// kickProgressLocked makes the next call about e's message now, or when the
// platform's limit allows, unless one is under way or due already.
func (s *Service) kickProgressLocked(e *progressEntry) {
	if e.inFlight || e.timer != nil || e.done {
		return
	}
	every := s.progressLimits(e.connector).Every
	if wait := e.lastCall.Add(every).Sub(s.clock.Now()); !e.lastCall.IsZero() && wait > 0 {
		e.timer = s.clock.AfterFunc(wait, func() {
			s.progress.mu.Lock()
			defer s.progress.mu.Unlock()
			e.timer = nil
			s.kickProgressLocked(e)
		})
		return
	}
	if e.want == e.shown && e.msg.ID != "" {
		return
	}
	e.inFlight = true
	msg := e.msg
	msg.Meta = maps.Clone(e.msg.Meta)
	msg.Text = cutProgressText(e.want, s.progressLimits(e.connector).MaxText)
	go s.callProgress(e, msg)
}

func (s *Service) progressLimits(connectorID string) connector.ProgressLimits {
	l := connector.ProgressLimits{Every: time.Second, MaxText: progressTextDefault}
	if rc, ok := s.connectorByID(connectorID); ok && rc.conn != nil {
		if pe, ok := rc.conn.(connector.ProgressEditor); ok {
			got := pe.ProgressLimits()
			if got.Every > 0 {
				l.Every = got.Every
			}
			if got.MaxText > 0 {
				l.MaxText = got.MaxText
			}
		}
	}
	return l
}

// callProgress posts or edits e's message to say msg.Text (no lock held).
func (s *Service) callProgress(e *progressEntry, msg connector.ProgressMessage) {
	rc, ok := s.connectorByID(e.connector)
	var pe connector.ProgressEditor
	if ok && rc.conn != nil {
		pe, _ = rc.conn.(connector.ProgressEditor)
	}
	if pe == nil {
		s.progress.mu.Lock()
		e.inFlight = false
		s.progress.mu.Unlock()
		return
	}
	var err error
	posted := ""
	ctx, cancel := context.WithTimeout(context.Background(), progressCallTimeout)
	if msg.ID == "" {
		posted, err = pe.PostProgress(ctx, msg)
	} else {
		err = pe.EditProgress(ctx, msg)
	}
	cancel()
	if err != nil {
		s.log.Debug("cannot show progress", "connector", e.connector, "run_id", e.runID, "err", redact(err.Error(), rc.secrets))
	}
	if posted != "" {
		// Kept with the message: a restarted intake deletes it too.
		if serr := s.store.setProgressMessage(e.key, posted, s.clock.Now()); serr != nil {
			s.log.Warn("cannot record the progress message", "connector", e.connector, "run_id", e.runID, "err", serr)
		}
	}
	s.progress.mu.Lock()
	e.inFlight = false
	e.lastCall = s.clock.Now()
	if err == nil {
		e.shown = msg.Text
	}
	if posted != "" {
		e.msg.ID = posted
	}
	late := e.done && posted != ""
	if !e.done && e.want != e.shown {
		s.kickProgressLocked(e)
	}
	s.progress.mu.Unlock()
	if late {
		// The reply was posted while this progress message was on its way.
		msg.ID = posted
		s.deleteProgress(rc, e.connector, msg, s.clock.Now())
	}
}

// finishProgress is called once r's reply was posted: the progress message
// goes (the one in memory, or the one the inbox entry names after a
// restart), and the message gets its status reaction.
func (s *Service) finishProgress(r outboxEntry) {
	rc, ok := s.connectorByID(r.Connector)
	if !ok || rc.conn == nil {
		return
	}
	key := busapi.MessageKey(r.Connector, r.MessageID)
	s.progress.mu.Lock()
	e, inMemory := s.progress.entries[key]
	var msg connector.ProgressMessage
	var lastCall time.Time
	if inMemory {
		msg, lastCall = e.msg, e.lastCall
		s.dropProgressLocked(key, e)
	}
	s.progress.mu.Unlock()
	mode, reactions := progressOf(rc)
	if !inMemory && mode == config.ProgressEdit {
		if m, found, err := s.store.message(r.Connector, r.MessageID); err == nil && found && m.ProgressMessage != "" {
			msg = connector.ProgressMessage{ID: m.ProgressMessage, MessageID: m.ID, Channel: m.Channel, Thread: m.Thread, Meta: replyMeta(m)}
		}
	}
	if msg.ID != "" {
		s.deleteProgress(rc, r.Connector, msg, lastCall)
	}
	if reactions {
		status := connector.ReactionSucceeded
		if connectorReply(r).Failed {
			status = connector.ReactionFailed
		}
		s.react(rc, connector.Reaction{MessageID: r.MessageID, Channel: r.Channel, Meta: maps.Clone(r.Meta), Status: status})
	}
}

// deleteProgress deletes a progress message, in the background, once the
// platform's limit allows after the last call about it (lastCall).
func (s *Service) deleteProgress(rc *running, connectorID string, msg connector.ProgressMessage, lastCall time.Time) {
	pe, ok := rc.conn.(connector.ProgressEditor)
	if !ok {
		return
	}
	wait := time.Duration(0)
	if !lastCall.IsZero() {
		wait = lastCall.Add(s.progressLimits(connectorID).Every).Sub(s.clock.Now())
	}
	key := busapi.MessageKey(connectorID, msg.MessageID)
	go func() {
		gone := true // deleted, or refused for good: forget it
		for attempt := 1; ; attempt++ {
			if wait > 0 {
				<-s.clock.After(wait)
			}
			ctx, cancel := context.WithTimeout(context.Background(), progressCallTimeout)
			err := pe.DeleteProgress(ctx, msg)
			cancel()
			if err == nil {
				break
			}
			text := redact(err.Error(), rc.secrets)
			if connector.IsPermanent(err) {
				s.log.Warn("the platform refuses to delete the progress message", "connector", connectorID, "message_id", msg.MessageID, "attempts", attempt, "err", text)
				break
			}
			if attempt == progressDeleteAttempts {
				// Kept in the progress index: intake's next start tries again.
				s.log.Warn("cannot delete the progress message; intake's next start tries again", "connector", connectorID, "message_id", msg.MessageID, "attempts", attempt, "err", text)
				gone = false
				break
			}
			wait = s.retryDelay.Delay(attempt)
			if after, ok := connector.RetryAfter(err); ok {
				wait = max(after, s.progressLimits(connectorID).Every)
			}
			s.log.Info("cannot delete the progress message; will retry", "connector", connectorID, "message_id", msg.MessageID, "attempts", attempt, "retry_in", wait, "err", text)
		}
		if !gone {
			return
		}
		if err := s.store.progressGone(key, s.clock.Now()); err != nil {
			s.log.Warn("cannot record the progress message's delete", "connector", connectorID, "message_id", msg.MessageID, "err", err)
		}
	}()
}

// deleteLeftoverProgress deletes the progress messages a crash or failed
// deletes left behind after their answer (store.leftoverProgress). Run
// calls it once the connectors are started.
func (s *Service) deleteLeftoverProgress() {
	left, err := s.store.leftoverProgress()
	if err != nil {
		s.log.Warn("cannot list progress messages left behind", "err", err)
		return
	}
	for _, m := range left {
		rc, ok := s.connectorByID(m.Connector)
		if !ok || rc.conn == nil {
			continue // connector gone: the record goes with its message
		}
		s.log.Info("deleting a progress message left behind", "connector", m.Connector, "message_id", m.ID)
		s.deleteProgress(rc, m.Connector, connector.ProgressMessage{ID: m.ProgressMessage, MessageID: m.ID, Channel: m.Channel, Thread: m.Thread, Meta: replyMeta(m)}, time.Time{})
	}
}

// react adds a status reaction, in the background; a failure is logged.
func (s *Service) react(rc *running, r connector.Reaction) {
	rx, ok := rc.conn.(connector.Reactor)
	if !ok || r.MessageID == "" {
		return
	}
	if ref := rc.reactionsRefused.Load(); ref != nil && ref.everywhere {
		return // the platform refused them for every channel: see berthctl status
	}
	s.progress.reacting.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), progressCallTimeout)
		defer cancel()
		err := rx.React(ctx, r)
		if err == nil {
			return
		}
		text := redact(err.Error(), rc.secrets)
		var np *connector.NotPermittedError
		if errors.As(err, &np) {
			text = redact(strings.TrimPrefix(err.Error(), np.What+": "), rc.secrets)
			if old := rc.reactionsRefused.Swap(&refusal{text: text, everywhere: np.Everywhere}); old == nil {
				s.log.Warn("the platform refuses reactions; berthctl status shows it", "connector", rc.cfg.ID, "err", text)
				s.refreshConnectors()
			}
			return
		}
		s.log.Warn("cannot add a reaction", "connector", rc.cfg.ID, "message_id", r.MessageID, "status", r.Status, "err", text)
	})
}

// refusal is a platform's standing refusal of a connector's reactions.
type refusal struct {
	text       string
	everywhere bool // intake adds none until it restarts
}

// reactionsState is what `berthctl status` shows of a connector's
// reactions: "off", "on", or why the platform refuses them.
func (rc *running) reactionsState() string {
	if !rc.cfg.Reactions {
		return "off"
	}
	if r := rc.reactionsRefused.Load(); r != nil {
		if r.everywhere {
			return "refused, none added until intake restarts: " + r.text
		}
		return "refused in a channel: " + r.text
	}
	return "on"
}

// cutProgressText cuts s to at most n bytes on a character boundary.
func cutProgressText(s string, n int) string {
	if n <= 0 || len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}
