package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/isolation"
)

// Live progress (docs/adr/0027-live-progress.md): the tool calls a run's
// agent reports (isolation picks them out of its log, capped and redacted)
// are passed on to intake as RunProgress signals, for the chat message the
// run answers. A run's events are coalesced, the latest wins, and sent at
// most once per runProgressEvery: an agent that reports a thousand tool
// calls a second costs the bus one signal a second. Nothing is stored; a
// run's last state is its reply.

// runProgressEvery is the shortest time between two RunProgress signals of
// one run.
const runProgressEvery = time.Second

// relayRunProgress returns ctx carrying the progress callback of run r, and
// the function that ends its relay once the run has returned (after it,
// no signal of the run is sent). Runs with no chat message (a scheduled
// job's) relay nothing.
func (s *Service) relayRunProgress(ctx context.Context, r Run) (context.Context, func()) {
	if r.Connector == "" || r.MessageID == "" {
		return ctx, func() {}
	}
	rp := &runProgressRelay{
		s: s,
		// r.MessageID is the message's key as intake sent it (Submission.Key):
		// intake finds the message's progress by that key. Prefixing the
		// connector again made a key no message has, so no progress was
		// ever shown through the daemons.
		base: busapi.RunProgress{RunID: r.ID, MessageKey: r.MessageID},
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go rp.loop()
	var once sync.Once
	end := func() {
		once.Do(func() {
			close(rp.stop)
			<-rp.done
		})
	}
	return isolation.WithProgress(ctx, rp.report), end
}

// runProgressRelay coalesces one run's progress and sends it.
type runProgressRelay struct {
	s    *Service
	base busapi.RunProgress

	mu     sync.Mutex
	latest *agentproto.Progress

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// report is the run's progress callback: it never blocks (it is called on
// the goroutine that copies the agent's stderr).
func (rp *runProgressRelay) report(p agentproto.Progress) {
	rp.mu.Lock()
	rp.latest = &p
	rp.mu.Unlock()
	select {
	case rp.wake <- struct{}{}:
	default:
	}
}

func (rp *runProgressRelay) loop() {
	defer close(rp.done)
	for {
		select {
		case <-rp.stop:
			return
		case <-rp.wake:
		}
		rp.mu.Lock()
		p := rp.latest
		rp.latest = nil
		rp.mu.Unlock()
		if p == nil {
			continue
		}
		rp.send(*p)
		select {
		case <-rp.stop:
			return
		case <-rp.s.clock.After(runProgressEvery):
		}
	}
}

func (rp *runProgressRelay) send(p agentproto.Progress) {
	conn := rp.s.bus()
	if conn == nil {
		return
	}
	sig := rp.base
	sig.Seq, sig.Text = uint32(max(p.Seq, 0)), p.Text
	if err := busapi.SendRunProgress(conn, sig); err != nil {
		rp.s.log.Debug("cannot send RunProgress", "run_id", sig.RunID, "err", err)
	}
}
