package kube

import (
	"context"
	"maps"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/isolation"
)

// pool keeps size running pods of one agent waiting on stdin, with no run,
// no identity and no request: the request binds when a run claims one
// (attach, then the request on stdin). Fields are guarded by Backend.mu.
type pool struct {
	agent   string
	spec    isolation.Spec
	size    int
	hash    string
	members []*session
	kick    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	// leaseAsked: the pool asked for the agent's lease (warmlease.go).
	leaseAsked bool
}

// Warm sets the warm pools: one per spec whose Kube.Warm is above zero and
// that needs no egress (Spec.Request is ignored). Pools of agents not in
// specs are drained.
func (b *Backend) Warm(specs []isolation.Spec) {
	want := map[string]isolation.Spec{}
	for _, s := range specs {
		if s.Backend == isolation.BackendKubernetes && s.Kube.Warm > 0 && s.Egress == nil {
			want[s.AgentID] = templateOf(s)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drained = false
	for agent, pl := range b.pools {
		if _, ok := want[agent]; !ok {
			delete(b.pools, agent)
			go b.stopPool(pl)
		}
	}
	for agent, spec := range want {
		if pl := b.pools[agent]; pl != nil {
			pl.spec, pl.size = spec, spec.Kube.Warm
			wake(pl.kick)
			continue
		}
		b.startPool(spec)
	}
}

// Drain stops every pool, deletes its waiting pods, waits for the
// deletions of finished runs' pods and releases the agents' leases.
func (b *Backend) Drain(ctx context.Context) error {
	b.mu.Lock()
	pools := b.pools
	b.pools = map[string]*pool{}
	b.drained = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, pl := range pools {
			b.stopPool(pl)
		}
		b.removals.Wait()
	}()
	select {
	case <-done:
		return b.ReleaseLeases(ctx) // lease.go: another host may serve the agents now
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// PoolSize is how many pods of agent wait for a request right now.
func (b *Backend) PoolSize(agent string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if pl := b.pools[agent]; pl != nil {
		return len(pl.members)
	}
	return 0
}

// PoolStats implements isolation.PoolReporter: every agent that has a
// pool or whose runs asked one, by agent id.
func (b *Backend) PoolStats() []isolation.PoolStat {
	b.mu.Lock()
	defer b.mu.Unlock()
	sizes := map[string][2]int{}
	for agent, pl := range b.pools {
		sizes[agent] = [2]int{len(pl.members), pl.size}
	}
	return b.takes.Stats(sizes)
}

func templateOf(s isolation.Spec) isolation.Spec {
	s.RunID, s.Attempt = "", 0
	s.Request = agentproto.Request{}
	s.OnStart = nil
	s.EgressToken = ""
	return s
}

// startPool makes the pool of spec's agent. b.mu is held.
func (b *Backend) startPool(spec isolation.Spec) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	pl := &pool{agent: spec.AgentID, spec: spec, size: spec.Kube.Warm, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	b.pools[spec.AgentID] = pl
	go b.fill(pl)
	return pl
}

func (b *Backend) stopPool(pl *pool) {
	pl.cancel()
	<-pl.done
	b.mu.Lock()
	members := pl.members
	pl.members = nil
	b.mu.Unlock()
	for _, m := range members {
		m.Release()
	}
}

// takeWarm hands a run a waiting pod made with its config hash, or nil;
// either way the pool is refilled in the background.
func (b *Backend) takeWarm(spec isolation.Spec, hash string) (taken *session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer func() { b.takes.Count(spec.AgentID, taken != nil) }()
	pl := b.pools[spec.AgentID]
	if pl == nil {
		if b.drained {
			return nil
		}
		pl = b.startPool(templateOf(spec))
	}
	if hash != pl.hash {
		pl.spec, pl.size = templateOf(spec), spec.Kube.Warm
	}
	defer wake(pl.kick)
	for i, m := range pl.members {
		if m.hash != hash {
			continue
		}
		pl.members = append(pl.members[:i:i], pl.members[i+1:]...)
		return m
	}
	return nil
}

func (b *Backend) fill(pl *pool) {
	defer close(pl.done)
	delay := backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	failures := 0
	for {
		var retry <-chan time.Time
		if err := b.fillOnce(pl); err != nil && pl.ctx.Err() == nil {
			failures++
			wait := delay.Delay(failures)
			b.log.Warn("cannot start warm pods; retrying", "agent", pl.agent, "in", wait, "err", err)
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

// fillOnce replaces stale members and starts missing ones.
func (b *Backend) fillOnce(pl *pool) error {
	if ok, err := b.mayWarm(pl); !ok { // warmlease.go
		b.emptyPool(pl)
		return err
	}
	b.mu.Lock()
	spec := pl.spec
	b.mu.Unlock()
	pod, hash, err := b.podFor(spec.Plan)
	if err != nil {
		return err
	}
	if err := b.ready(pl.ctx, spec.Plan); err != nil {
		return err
	}
	b.mu.Lock()
	pl.hash = hash
	var stale []*session
	kept := pl.members[:0]
	for _, m := range pl.members {
		if m.hash != hash {
			stale = append(stale, m)
		} else {
			kept = append(kept, m)
		}
	}
	pl.members = kept
	b.mu.Unlock()
	for _, m := range stale {
		m.Release()
	}
	for {
		b.mu.Lock()
		missing := pl.size - len(pl.members)
		b.mu.Unlock()
		if missing <= 0 || pl.ctx.Err() != nil {
			return nil
		}
		member := pod.DeepCopy()
		member.Labels = maps.Clone(pod.Labels)
		member.Labels[LabelPool] = labelValue(pl.agent)
		member.Name = podName("warm-" + pl.agent)
		// It waits for as long as it takes; Sweep and Drain end it.
		member.Spec.ActiveDeadlineSeconds = nil
		b.own(member.Name)
		s, err := b.createAndWait(pl.ctx, member, spec.Plan)
		if err != nil {
			b.disown(member.Name)
			return err
		}
		s.hash = hash
		b.mu.Lock()
		if pl.ctx.Err() != nil || hash != pl.hash {
			b.mu.Unlock()
			s.Release()
			return nil
		}
		pl.members = append(pl.members, s)
		b.mu.Unlock()
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
