package kube

import (
	"errors"
)

// Warm pods follow the agent's lease (ADR 28): a host keeps warm pods of
// an agent only while it holds the agent's Lease, so the hosts that share a
// cluster keep one warm pool per agent, on the host that serves it, not one
// on every host configured with it.
//
//   - A pool takes the lease when it starts if no other host holds it, as
//     a run would (warm = N says this host serves the agent): the first
//     message after a start is warm.
//   - It never takes it later: a lease another host released or let lapse
//     is taken by this host's next run of the agent, and the pool fills
//     then. Polling for a free lease would hand an agent to whichever idle
//     host polled first, e.g. during the holder's restart.
//   - When another host takes the lease (this host's renewal finds it, or
//     a run here is refused), the pool's waiting pods are deleted.

// mayWarm says whether pl may hold pods now. b.mu is not held.
func (b *Backend) mayWarm(pl *pool) (bool, error) {
	if b.host == "" {
		return true, nil
	}
	b.mu.Lock()
	spec, asked := pl.spec, pl.leaseAsked
	b.mu.Unlock()
	l := b.leaseOf(spec.Kube.Namespace, pl.agent)
	b.leases.mu.Lock()
	held := l.held
	b.leases.mu.Unlock()
	if held || asked {
		return held, nil
	}
	err := b.claim(pl.ctx, spec.Plan)
	if err != nil && !errors.Is(err, ErrLeaseHeld) {
		return false, err // asked again at the retry
	}
	b.mu.Lock()
	pl.leaseAsked = true
	b.mu.Unlock()
	return err == nil, nil
}

// leaseMoved wakes the pool of agent after its lease came to this host or
// went to another, so it fills or empties.
func (b *Backend) leaseMoved(agent string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if pl := b.pools[agent]; pl != nil {
		wake(pl.kick)
	}
}

// emptyPool deletes the waiting pods of pl: its host does not hold the
// agent's lease.
func (b *Backend) emptyPool(pl *pool) {
	b.mu.Lock()
	members := pl.members
	pl.members = nil
	b.mu.Unlock()
	if len(members) > 0 {
		b.log.Info("another berth host holds an agent's lease; deleting this host's warm pods of it", "agent", pl.agent, "pods", len(members))
	}
	for _, m := range members {
		m.Release()
	}
}
