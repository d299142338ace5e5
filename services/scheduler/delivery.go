package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
)

// Deliverer hands a finished run's reply (keys of dev.berth.Intake1.Deliver)
// to intake. It returns nil only once intake has stored the reply.
type Deliverer interface {
	Deliver(ctx context.Context, reply map[string]string) error
}

// BusDeliverer delivers through dev.berth.Intake1.Deliver, starting intake by
// D-Bus activation when it is not running.
type BusDeliverer struct {
	Conn *dbus.Conn
}

// Deliver calls dev.berth.Intake1.Deliver.
func (d BusDeliverer) Deliver(ctx context.Context, reply map[string]string) error {
	call := d.Conn.Object(bus.IntakeName, bus.IntakePath).CallWithContext(ctx, bus.IntakeInterface+".Deliver", 0, reply)
	if call.Err != nil {
		return fmt.Errorf("cannot deliver run %s to intake: %w", reply["run_id"], call.Err)
	}
	return nil
}

// Delivery back-off: the first retry after minRetryDelay, doubling up to
// maxRetryDelay.
const (
	minRetryDelay  = 250 * time.Millisecond
	maxRetryDelay  = 30 * time.Second
	deliverTimeout = 30 * time.Second
)

// ReplyOf is what intake gets for a finished run.
func ReplyOf(r Run) map[string]string {
	return map[string]string{
		"run_id":     r.ID,
		"message_id": r.MessageID,
		"connector":  r.Connector,
		"agent":      r.Agent,
		"channel":    r.Channel,
		"thread":     r.Thread,
		"state":      r.State,
		"text":       replyText(r),
		"error":      r.Error,
	}
}

type retry struct {
	next  time.Time
	delay time.Duration
}

// deliverLoop delivers pending replies until ctx is done, each one retried
// with capped exponential back-off until the Deliverer accepts it.
func (s *Service) deliverLoop(ctx context.Context) {
	if s.opts.Deliverer == nil {
		s.log.Warn("no deliverer: finished runs stay pending")
		return
	}
	retries := map[string]*retry{}
	for {
		var ids []string
		_ = s.store.db.View(func(tx *bolt.Tx) error {
			ids = pendingDeliveryIDs(tx)
			return nil
		})
		var nextWake time.Duration = -1
		pending := make(map[string]bool, len(ids))
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			pending[id] = true
			rt := retries[id]
			if rt != nil && time.Now().Before(rt.next) {
				nextWake = earlier(nextWake, time.Until(rt.next))
				continue
			}
			err := s.deliver(ctx, id)
			if err == nil {
				delete(retries, id)
				continue
			}
			if rt == nil {
				rt = &retry{delay: minRetryDelay}
				retries[id] = rt
			} else {
				rt.delay = min(rt.delay*2, maxRetryDelay)
			}
			rt.next = time.Now().Add(rt.delay)
			nextWake = earlier(nextWake, rt.delay)
			s.log.Warn("cannot deliver reply; will retry", "run", id, "in", rt.delay, "err", err)
		}
		for id := range retries {
			if !pending[id] {
				delete(retries, id)
			}
		}
		if !s.waitForDeliveries(ctx, nextWake) {
			return
		}
	}
}

// waitForDeliveries waits for a new delivery or d (forever when d < 0); it
// reports false when ctx is done.
func (s *Service) waitForDeliveries(ctx context.Context, d time.Duration) bool {
	var timer <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
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

// deliver hands one run to the Deliverer and marks it delivered.
func (s *Service) deliver(ctx context.Context, id string) error {
	r, err := s.GetRun(id)
	if err != nil {
		return err
	}
	if !Finished(r.State) || r.Delivered {
		return nil
	}
	if r.Connector != "" {
		dctx, cancel := context.WithTimeout(ctx, deliverTimeout)
		err = s.opts.Deliverer.Deliver(dctx, ReplyOf(r))
		cancel()
		if bus.ErrorName(err) == bus.ErrInvalidArgument {
			// Intake will never take it (say, the connector was removed):
			// retrying forever helps nobody. The run keeps its reply.
			s.log.Error("intake refused the reply for good; it stays in the run record only", "run", id, "connector", r.Connector, "err", err)
		} else if err != nil {
			return err
		}
	}
	err = s.store.db.Update(func(tx *bolt.Tx) error {
		cur, ok, err := getRun(tx, id)
		if err != nil || !ok {
			return err
		}
		cur.Delivered = true
		return putRun(tx, cur)
	})
	if err != nil {
		return fmt.Errorf("cannot mark run %s delivered: %w", id, err)
	}
	s.log.Info("reply delivered", "run", id, "connector", r.Connector)
	return nil
}
