package intake

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// lanes runs one worker per connector, so that a platform (or a Submit) that
// never answers holds up only its own connector's messages. A worker calls
// pass at its start, whenever it is poked, and when the delay its last pass
// asked for has passed, until the lanes' context ends.
type lanes struct {
	ctx    context.Context
	clock  clockwork.Clock
	pass   func(ctx context.Context, connector string) (time.Duration, bool)
	onPass func(connector string)
	wg     sync.WaitGroup

	mu   sync.Mutex
	wake map[string]chan struct{}
}

func newLanes(ctx context.Context, clock clockwork.Clock, pass func(context.Context, string) (time.Duration, bool), onPass func(string)) *lanes {
	return &lanes{ctx: ctx, clock: clock, pass: pass, onPass: onPass, wake: map[string]chan struct{}{}}
}

// poke starts the connector's worker when it has none and wakes it.
func (l *lanes) poke(connector string) {
	l.mu.Lock()
	ch, ok := l.wake[connector]
	if !ok {
		if l.ctx.Err() != nil {
			l.mu.Unlock()
			return
		}
		ch = make(chan struct{}, 1)
		l.wake[connector] = ch
		l.wg.Go(func() {
			runLoop(l.ctx, l.clock, ch, 0,
				func(ctx context.Context) (time.Duration, bool) { return l.pass(ctx, connector) },
				func() { l.onPass(connector) })
		})
	}
	l.mu.Unlock()
	wake(ch)
}

// wait returns once every worker has returned (after the context ended).
func (l *lanes) wait() { l.wg.Wait() }

// runLoop calls pass at start, whenever woken, and when the delay pass asks
// for has passed, until ctx is done. With every > 0 it also passes at least
// that often. onPass is called after each pass, once the next one is
// scheduled.
func runLoop(ctx context.Context, clock clockwork.Clock, wakeUp <-chan struct{}, every time.Duration, pass func(context.Context) (time.Duration, bool), onPass func()) {
	timer := clock.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wakeUp:
		case <-timer.Chan():
		}
		next, ok := pass(ctx)
		if every > 0 && (!ok || next > every) {
			next, ok = every, true
		}
		timer.Stop()
		if ok {
			timer.Reset(next)
		}
		onPass()
	}
}
