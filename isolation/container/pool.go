package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/isolation"
)

// Back-off of a pool that cannot start members (engine down, image missing).
const (
	poolRetryMin = time.Second
	poolRetryMax = 30 * time.Second
)

// pool keeps size started containers of one agent waiting for a request.
// Its fields are guarded by Backend.poolMu; fill runs in its own goroutine.
type pool struct {
	agent   string
	spec    isolation.Spec // the agent's settings, without any request
	size    int
	hash    string // the config hash fill last prepared
	members []*session

	kick    chan struct{}
	ctx     context.Context // canceled when the pool stops
	cancel  context.CancelFunc
	stopped bool
	done    chan struct{}
}

// Warm sets the warm pools: one per spec whose Container.Warm is above zero
// (Spec.Request is ignored; no request ever goes into a pool). Pools of
// agents not in specs are drained. Members are started in the background;
// members made with another image or config are replaced.
func (b *Backend) Warm(specs []isolation.Spec) {
	want := map[string]isolation.Spec{}
	for _, s := range specs {
		if s.Container.Warm > 0 && s.Egress == nil {
			want[s.AgentID] = templateOf(s)
		}
	}
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	b.drained = false
	for agent, pl := range b.pools {
		if _, ok := want[agent]; !ok {
			delete(b.pools, agent)
			go b.stopPool(pl)
		}
	}
	for agent, spec := range want {
		if pl := b.pools[agent]; pl != nil {
			pl.spec, pl.size = spec, spec.Container.Warm
			wake(pl.kick)
			continue
		}
		b.startPool(spec)
	}
}

// Drain stops every pool and removes its waiting containers, and waits for
// what is under way of finished runs' containers (with
// Options.RemoveInBackground: their kill, exit and removal). Containers
// still serving a run are removed by that run.
func (b *Backend) Drain(ctx context.Context) error {
	b.poolMu.Lock()
	pools := b.pools
	b.pools = map[string]*pool{}
	b.drained = true
	b.poolMu.Unlock()
	return waitFor(ctx, func() {
		for _, pl := range pools {
			b.stopPool(pl)
		}
		b.removals.Wait() // RemoveInBackground: what finished runs left to end
	})
}

// Settle waits until what finished runs left to end in the background
// (Options.RemoveInBackground) is done, without stopping the pools: a
// benchmark measures each message on an engine that is not still ending
// the one before.
func (b *Backend) Settle(ctx context.Context) error {
	return waitFor(ctx, b.removals.Wait)
}

// waitFor runs work and waits until it is done or ctx ends, whichever is
// first; work left running then goes on by itself.
func waitFor(ctx context.Context, work func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		work()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// PoolSize is how many containers of agent wait for a request right now.
func (b *Backend) PoolSize(agent string) int {
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if pl := b.pools[agent]; pl != nil {
		return len(pl.members)
	}
	return 0
}

// PoolStats implements isolation.PoolReporter: every agent that has a
// pool or whose runs asked one, by agent id.
func (b *Backend) PoolStats() []isolation.PoolStat {
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	sizes := map[string][2]int{}
	for agent, pl := range b.pools {
		sizes[agent] = [2]int{len(pl.members), pl.size}
	}
	return b.takes.Stats(sizes)
}

// templateOf strips what belongs to one run from a spec.
func templateOf(s isolation.Spec) isolation.Spec {
	s.RunID, s.Attempt = "", 0
	s.Request = agentproto.Request{}
	s.OnStart = nil
	return s
}

// startPool makes and starts the pool of spec's agent. poolMu is held.
func (b *Backend) startPool(spec isolation.Spec) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	pl := &pool{
		agent:  spec.AgentID,
		spec:   spec,
		size:   spec.Container.Warm,
		kick:   make(chan struct{}, 1),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	b.pools[spec.AgentID] = pl
	go b.fill(pl)
	return pl
}

// stopPool ends fill and removes the members. The pool is out of b.pools.
func (b *Backend) stopPool(pl *pool) {
	b.poolMu.Lock()
	pl.stopped = true
	members := pl.members
	pl.members = nil
	b.poolMu.Unlock()
	pl.cancel()
	<-pl.done
	for _, m := range members {
		m.close()
		b.release(m.id)
	}
}

// takeWarm hands a run a waiting container made with the run's config hash,
// or returns nil. Either way the pool is refilled in the background, and
// told about a changed config so stale members are replaced.
func (b *Backend) takeWarm(spec isolation.Spec, hash string) (taken *session) {
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	defer func() { b.takes.Count(spec.AgentID, taken != nil) }()
	pl := b.pools[spec.AgentID]
	if pl == nil {
		if b.drained {
			return nil
		}
		// A backend nobody called Warm on learns the agent from its first run.
		pl = b.startPool(templateOf(spec))
	}
	if hash != pl.hash {
		pl.spec, pl.size = templateOf(spec), spec.Container.Warm
	}
	defer wake(pl.kick)
	for i, m := range pl.members {
		if m.hash != hash || m.exited() {
			continue
		}
		pl.members = append(pl.members[:i:i], pl.members[i+1:]...)
		return m
	}
	return nil
}

// fill keeps pl at its size until it stops.
func (b *Backend) fill(pl *pool) {
	defer close(pl.done)
	retryDelay := backoff.Policy{Min: poolRetryMin, Max: poolRetryMax}
	failures := 0
	for {
		var retry <-chan time.Time
		if err := b.fillOnce(pl); err != nil && pl.ctx.Err() == nil {
			failures++
			wait := retryDelay.Delay(failures)
			b.log.Warn("cannot start warm containers; retrying", "agent", pl.agent, "in", wait, "err", err)
			retry = time.After(wait)
		} else {
			failures = 0
		}
		select {
		case <-pl.ctx.Done():
			return
		case <-pl.kick:
		case <-retry:
		}
	}
}

// fillOnce replaces stale and dead members and starts missing ones.
func (b *Backend) fillOnce(pl *pool) error {
	b.poolMu.Lock()
	spec := pl.spec
	b.poolMu.Unlock()
	p, err := b.prepare(pl.ctx, spec.Plan)
	if err != nil {
		return err
	}
	b.poolMu.Lock()
	pl.hash = p.hash
	var stale []*session
	kept := pl.members[:0]
	for _, m := range pl.members {
		if m.hash != p.hash || m.exited() {
			stale = append(stale, m)
		} else {
			kept = append(kept, m)
		}
	}
	pl.members = kept
	b.poolMu.Unlock()
	for _, m := range stale {
		m.close()
		b.release(m.id)
	}
	for {
		b.poolMu.Lock()
		missing := pl.size - len(pl.members)
		b.poolMu.Unlock()
		if missing <= 0 || pl.ctx.Err() != nil {
			return nil
		}
		m, err := b.startMember(pl.ctx, pl.agent, p)
		if err != nil {
			return err
		}
		b.poolMu.Lock()
		if pl.stopped || m.hash != pl.hash {
			b.poolMu.Unlock()
			m.close()
			b.release(m.id)
			return nil
		}
		pl.members = append(pl.members, m)
		b.poolMu.Unlock()
	}
}

// startMember creates a container labelled berth.pool, attaches to it and
// starts it: berth-agent then blocks reading its request.
func (b *Backend) startMember(ctx context.Context, agent string, p prepared) (*session, error) {
	cfg := *p.config
	cfg.Labels = maps.Clone(p.config.Labels)
	delete(cfg.Labels, LabelRun)
	delete(cfg.Labels, LabelAttempt)
	cfg.Labels[LabelPool] = agent
	var r [3]byte
	_, _ = rand.Read(r[:])
	// Not ctx: a create canceled by a drain may still complete in the engine,
	// and a container whose id we never learnt would be left behind.
	createCtx, cancel := b.call(context.WithoutCancel(ctx))
	created, err := b.cli.ContainerCreate(createCtx, client.ContainerCreateOptions{Config: &cfg, HostConfig: p.host, Name: "berth-warm-" + agent + "-" + hex.EncodeToString(r[:])})
	cancel()
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot create warm container", Err: err}
	}
	b.poolMu.Lock()
	b.owned[created.ID] = true
	b.poolMu.Unlock()
	if ctx.Err() != nil {
		b.release(created.ID)
		return nil, context.Cause(ctx)
	}
	s, err := b.begin(ctx, created.ID)
	if err != nil {
		b.release(created.ID)
		return nil, err
	}
	s.hash = p.hash
	return s, nil
}

// release removes a container after its run (or a warm one nobody will
// use) and forgets that this process owns it.
func (b *Backend) release(id string) {
	b.remove(id)
	b.poolMu.Lock()
	delete(b.owned, id)
	b.poolMu.Unlock()
}

// own marks id as a container this process ends itself, so Sweep leaves it.
func (b *Backend) own(id string) {
	b.poolMu.Lock()
	b.owned[id] = true
	b.poolMu.Unlock()
}

// owns reports whether id is a container this process ends itself: a warm
// one (waiting in a pool or serving a run), or one being ended after its
// run returned.
func (b *Backend) owns(id string) bool {
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	return b.owned[id]
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
