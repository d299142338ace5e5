package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"
	"go.opentelemetry.io/otel/codes"

	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/isolation"
)

// Deliverer hands a finished run's reply to intake. It returns nil only once
// intake has stored the reply.
type Deliverer interface {
	Deliver(ctx context.Context, reply busapi.Reply) error
}

// BusDeliverer delivers through dev.berth.Intake1.Deliver, starting intake by
// D-Bus activation when it is not running.
type BusDeliverer struct {
	Conn *dbus.Conn
}

// Deliver calls dev.berth.Intake1.Deliver, or DeliverFiles for a reply
// with files.
func (d BusDeliverer) Deliver(ctx context.Context, reply busapi.Reply) error {
	if err := busapi.NewIntake(d.Conn).Deliver(ctx, reply); err != nil {
		return fmt.Errorf("cannot deliver run %s to intake: %w", reply.RunID, err)
	}
	return nil
}

// Delivery back-off: the first retry after minRetryDelay, doubling up to
// maxRetryDelay. A reply whose Deliver fails as malformed (a wire-format or
// invalid-args error) maxMalformedAttempts times can never be delivered.
const (
	minRetryDelay        = 250 * time.Millisecond
	maxRetryDelay        = 30 * time.Second
	deliverTimeout       = 30 * time.Second
	maxMalformedAttempts = 3
)

// ReplyOf is what intake gets for a finished run. Every text is cleaned:
// records written by older builds were not.
func ReplyOf(r Run) busapi.Reply {
	connector := cleanText(r.Connector)
	return busapi.Reply{
		RunID:     cleanText(r.ID),
		MessageID: busapi.MessageIDOf(connector, cleanText(r.MessageID)),
		Connector: connector,
		Agent:     cleanText(r.Agent),
		Channel:   cleanText(r.Channel),
		Thread:    cleanText(r.Thread),
		State:     cleanText(r.State),
		Text:      cleanText(replyText(r)),
		Error:     cleanText(r.Error),
	}
}

type retry struct {
	next      time.Time
	delay     time.Duration
	malformed int // failures that say the reply itself is wrong
}

// deliverLoop delivers pending replies until ctx is done, each one retried
// with capped exponential back-off until the Deliverer accepts it, or until
// it is clear that it never will. It returns an error when the store fails.
func (s *Service) deliverLoop(ctx context.Context) error {
	if s.opts.Deliverer == nil {
		s.log.Warn("no deliverer: finished runs stay pending")
		return nil
	}
	retries := map[string]*retry{}
	for {
		var ids []string
		err := s.store.db.View(func(tx *bolt.Tx) error {
			var err error
			ids, err = pendingDeliveryIDs(tx)
			return err
		})
		if err != nil {
			return fmt.Errorf("cannot read pending deliveries: %w", err)
		}
		var nextWake time.Duration = -1
		pending := make(map[string]bool, len(ids))
		for _, id := range ids {
			if ctx.Err() != nil {
				return nil
			}
			pending[id] = true
			rt := retries[id]
			if rt != nil && s.clock.Now().Before(rt.next) {
				nextWake = earlier(nextWake, s.clock.Until(rt.next))
				continue
			}
			if rt == nil {
				rt = &retry{}
			}
			err, storeErr := s.deliver(ctx, id, rt)
			if storeErr != nil {
				return storeErr
			}
			if err == nil {
				delete(retries, id)
				continue
			}
			if rt.delay == 0 {
				rt.delay = minRetryDelay
			} else {
				rt.delay = min(rt.delay*2, maxRetryDelay)
			}
			retries[id] = rt
			rt.next = s.clock.Now().Add(rt.delay)
			nextWake = earlier(nextWake, rt.delay)
			s.log.Warn("cannot deliver reply; will retry", "run_id", id, "in", rt.delay, "err", err)
		}
		for id := range retries {
			if !pending[id] {
				delete(retries, id)
			}
		}
		if !s.waitForDeliveries(ctx, nextWake) {
			return nil
		}
	}
}

// waitForDeliveries waits for a new delivery or d (forever when d < 0); it
// reports false when ctx is done.
func (s *Service) waitForDeliveries(ctx context.Context, d time.Duration) bool {
	var timer <-chan time.Time
	if d >= 0 {
		t := s.clock.NewTimer(d)
		defer t.Stop()
		timer = t.Chan()
	}
	select {
	case <-ctx.Done():
		return false
	case <-s.wakeDeliver:
	case <-timer:
	}
	return true
}

func earlier(cur, d time.Duration) time.Duration {
	if cur < 0 || d < cur {
		return d
	}
	return cur
}

// malformedReply says whether err means the reply itself cannot be sent or
// taken: godbus refused to encode it, or the callee said its arguments were
// invalid. Retrying the same reply gives the same answer.
func malformedReply(err error) bool {
	var fe dbus.FormatError
	if errors.As(err, &fe) {
		return true
	}
	var ie dbus.InvalidMessageError
	if errors.As(err, &ie) {
		return true
	}
	return bus.ErrorName(err) == "org.freedesktop.DBus.Error.InvalidArgs"
}

// deliver hands one run to the Deliverer and marks it delivered. err is the
// Deliverer's (retry later); storeErr says the store failed.
func (s *Service) deliver(ctx context.Context, id string, rt *retry) (err, storeErr error) {
	r, err := s.GetRun(id)
	if errors.Is(err, ErrNotFound) {
		return nil, nil // quarantined or gone: nothing to deliver
	}
	if err != nil {
		return nil, err
	}
	if !Finished(r.State) || r.Delivered {
		return nil, nil
	}
	undeliverable := ""
	quiet := quietHeartbeat(r)
	if r.Connector != "" && !quiet {
		dctx, cancel := context.WithTimeout(ctx, deliverTimeout)
		dctx, span := tracing.Tracer().Start(traced(dctx, r), spanDeliver, runAttrs(r))
		reply := ReplyOf(r)
		reply.Traceparent = tracing.Traceparent(dctx)
		if len(r.ReplyFiles) > 0 {
			files, ferr := s.openReplyFiles(r)
			if ferr != nil {
				s.log.Error("cannot open the reply's files; it is delivered without them", "run_id", id, "err", ferr)
				reply.Text = busapi.WithNotes(reply.Text, []string{"the files of this reply were not sent: the scheduler lost its copy"})
			}
			reply.Files = files
		}
		err = s.opts.Deliverer.Deliver(dctx, reply)
		busapi.CloseFiles(reply.Files)
		if err != nil {
			span.SetStatus(codes.Error, "intake did not take the reply")
		}
		span.End()
		cancel()
		switch {
		case err == nil:
		case bus.ErrorName(err) == bus.ErrInvalidArgument:
			// Intake will never take it (say, the connector was removed):
			// retrying forever helps nobody.
			undeliverable = fmt.Sprintf("intake refused the reply for good: %v", err)
		case malformedReply(err):
			rt.malformed++
			if rt.malformed < maxMalformedAttempts {
				return err, nil
			}
			undeliverable = fmt.Sprintf("the reply could not be sent in %d attempts: %v", rt.malformed, err)
		default:
			return err, nil
		}
	}
	now := s.clock.Now()
	var final Run
	err = s.store.write(func(tx *bolt.Tx) error {
		final = Run{}
		cur, ok, err := getRun(tx, id)
		if err != nil || !ok {
			return err
		}
		cur.Delivered = true
		if undeliverable != "" {
			// The run keeps its reply; its outcome says why nobody got it.
			cur.State, cur.Reason, cur.FinishedAt = StateFailed, isolation.ReasonUndeliverable, now
			cur.Error = cleanText(undeliverable)
		}
		final = cur
		return putRun(tx, cur)
	})
	if c, bad := asCorrupt(err); bad {
		s.setAside(c)
		return nil, nil
	}
	if boltstore.IsDiskFull(err) {
		// Retried with back-off; intake keeps replies by run id, so
		// sending this one again is harmless.
		return fmt.Errorf("cannot mark run %s delivered: %w", id, err), nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot mark run %s delivered: %w", id, err)
	}
	if len(r.ReplyFiles) > 0 {
		s.removeReplyFiles(id) // intake has its own copy, or never will
	}
	if undeliverable != "" {
		s.log.Error("reply cannot be delivered; the run is failed and keeps its reply", "run_id", id, "agent", r.Agent, "connector", r.Connector, "message_id", r.MessageID, "err", undeliverable)
		s.emitFinished(final)
	} else if quiet {
		s.log.Info("scheduled run checked in with "+schedules.HeartbeatOK+"; its reply is not delivered", "run_id", id, "agent", r.Agent, "schedule", r.Schedule)
	} else {
		s.log.Info("reply delivered", "run_id", id, "agent", r.Agent, "connector", r.Connector, "message_id", r.MessageID)
		s.countDelivered(r)
	}
	return nil, nil
}
