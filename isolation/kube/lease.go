package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/berth-dev/berth/isolation"
)

// Agents are sharded between the berth hosts that share a cluster by a
// coordination.k8s.io Lease per (namespace, agent) (ADR 28): the host that
// holds it serves the agent's runs and renews it; another host configured
// with the same agent refuses them with a reason naming the holder, until
// the holder releases the lease (its scheduler stops) or stops renewing it
// for LeaseDuration (it died). The lease guards the start of a run; the
// holder's runs already going keep going.
const (
	// LeaseDuration is how long a lease holds without renewal.
	LeaseDuration = 15 * time.Second
	// leaseRenew is how often the holder renews; leaseFresh how recent the
	// last renewal must be for a run to start without asking the API server.
	leaseRenew = 5 * time.Second
	leaseFresh = 10 * time.Second
	// LabelLease marks berth's leases; the value is the agent.
	LabelLease = "berth.lease"
)

// LeaseName is the name of an agent's lease: readable, a DNS subdomain,
// and unique per agent id.
func LeaseName(agent string) string {
	sum := sha256.Sum256([]byte(agent))
	name := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			return c
		case c >= 'A' && c <= 'Z':
			return c + 'a' - 'A'
		}
		return '-'
	}, agent)
	name = strings.Trim(name[:min(len(name), 40)], "-")
	return "berth-agent-" + name + "-" + hex.EncodeToString(sum[:4])
}

// leases are the agents' leases as this backend knows them; guarded by mu,
// which is never held across an API call.
type leases struct {
	mu sync.Mutex
	by map[string]*lease // namespace/name
}

// lease is one agent's lease as this backend last saw it.
type lease struct {
	ns, name, agent string

	held      bool
	renewed   time.Time // when this backend last acquired or renewed it
	holder    string    // the holder last seen ("" none)
	rawSeen   []byte    // the record last seen, and when it changed:
	seenAt    time.Time // another holder's lease expires LeaseDuration after
	stopRenew context.CancelFunc
	renewing  chan struct{}
}

// ErrLeaseHeld is a run refused because another berth host holds its
// agent's lease.
var ErrLeaseHeld = errors.New("the agent's lease is held by another berth host")

func (b *Backend) leaseOf(ns, agent string) *lease {
	name := LeaseName(agent)
	b.leases.mu.Lock()
	defer b.leases.mu.Unlock()
	if b.leases.by == nil {
		b.leases.by = map[string]*lease{}
	}
	l := b.leases.by[ns+"/"+name]
	if l == nil {
		l = &lease{ns: ns, name: name, agent: agent}
		b.leases.by[ns+"/"+name] = l
	}
	return l
}

// claim makes sure this backend holds the lease of p's agent before its
// run starts: at once when it renewed it lately, else by acquiring it now.
// A backend without a host identity (one host only) claims nothing.
func (b *Backend) claim(ctx context.Context, p isolation.Plan) error {
	if b.host == "" {
		return nil
	}
	l := b.leaseOf(p.Kube.Namespace, p.AgentID)
	b.leases.mu.Lock()
	fresh := l.held && time.Since(l.renewed) < leaseFresh
	b.leases.mu.Unlock()
	if fresh {
		return nil
	}
	return b.acquire(ctx, l)
}

// acquire takes or renews l; ErrLeaseHeld (in a RunError naming the holder)
// when another host holds it. Concurrent calls are safe: the API server's
// optimistic concurrency lets one update win, and the loser reads again.
func (b *Backend) acquire(ctx context.Context, l *lease) error {
	var lastErr error
	for range 3 {
		err := b.tryAcquire(ctx, l)
		if err == nil || errors.Is(err, ErrLeaseHeld) {
			return err
		}
		lastErr = err
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			break
		}
	}
	return b.apiError(fmt.Sprintf("take lease %s/%s of agent %s", l.ns, l.name, l.agent), lastErr)
}

func (b *Backend) lock(l *lease) *resourcelock.LeaseLock {
	return &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.ns, Name: l.name},
		Labels:     map[string]string{LabelLease: labelValue(l.agent)},
		Client:     b.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: b.Identity()},
	}
}

func (b *Backend) tryAcquire(ctx context.Context, l *lease) error {
	me := b.Identity()
	lock := b.lock(l)
	now := time.Now()
	rec := resourcelock.LeaderElectionRecord{HolderIdentity: me, LeaseDurationSeconds: int(LeaseDuration / time.Second),
		AcquireTime: metav1.NewTime(now), RenewTime: metav1.NewTime(now)}
	getCtx, cancel := b.call(ctx)
	old, raw, err := lock.Get(getCtx)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		createCtx, cancel := b.call(ctx)
		err = lock.Create(createCtx, rec)
		cancel()
		if err != nil {
			return err
		}
		b.took(l, now)
		return nil
	case err != nil:
		return err
	}
	b.leases.mu.Lock()
	if !bytes.Equal(raw, l.rawSeen) {
		l.rawSeen, l.seenAt = raw, now
	}
	l.holder = old.HolderIdentity
	seenAt := l.seenAt
	b.leases.mu.Unlock()
	switch {
	case old.HolderIdentity == me:
		rec.AcquireTime, rec.LeaderTransitions = old.AcquireTime, old.LeaderTransitions
	case old.HolderIdentity != "" && now.Before(seenAt.Add(time.Duration(old.LeaseDurationSeconds)*time.Second)):
		b.leases.mu.Lock()
		l.held = false
		b.leases.mu.Unlock()
		b.leaseMoved(l.agent) // warm pods follow the lease
		return &isolation.RunError{Reason: isolation.ReasonStart, Err: ErrLeaseHeld,
			Detail: fmt.Sprintf("agent %s is served by berth host %s, which holds Lease %s/%s (renewed %s); this host (%s) refuses its runs so that two hosts never serve one agent: configure the agent on one host only (ADR 28), or stop that host's scheduler and the lease passes here",
				l.agent, old.HolderIdentity, l.ns, l.name, old.RenewTime.UTC().Format(time.RFC3339), me)}
	default: // released, or expired: its holder stopped renewing
		rec.LeaderTransitions = old.LeaderTransitions + 1
	}
	updCtx, cancel := b.call(ctx)
	err = lock.Update(updCtx, rec)
	cancel()
	if err != nil {
		return err
	}
	b.took(l, now)
	return nil
}

// took records l as held and starts renewing it.
func (b *Backend) took(l *lease, at time.Time) {
	b.leases.mu.Lock()
	defer b.leases.mu.Unlock()
	wasHeld := l.held
	l.held, l.renewed, l.holder = true, at, b.Identity()
	if !wasHeld {
		go b.leaseMoved(l.agent) // warm pods follow the lease; not under leases.mu
	}
	if l.stopRenew != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stopRenew, l.renewing = cancel, make(chan struct{})
	go b.renew(ctx, l, l.renewing)
}

// renew keeps l until another host takes it or the backend releases it.
func (b *Backend) renew(ctx context.Context, l *lease, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(leaseRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := b.tryAcquire(ctx, l)
		if errors.Is(err, ErrLeaseHeld) {
			b.log.Warn("another berth host took an agent's lease; this host refuses the agent's runs", "agent", l.agent, "lease", l.ns+"/"+l.name, "holder", l.holder)
			b.leases.mu.Lock()
			l.stopRenew, l.renewing = nil, nil
			b.leases.mu.Unlock()
			return
		}
		if err != nil && ctx.Err() == nil {
			b.log.Warn("cannot renew an agent's lease", "agent", l.agent, "lease", l.ns+"/"+l.name, "err", err)
		}
	}
}

// ReleaseLeases gives up every lease this backend holds (its scheduler
// stops), so another host may serve the agents at once rather than after
// LeaseDuration.
func (b *Backend) ReleaseLeases(ctx context.Context) error {
	b.leases.mu.Lock()
	var mine []*lease
	for _, l := range b.leases.by {
		if l.stopRenew != nil {
			l.stopRenew()
			mine = append(mine, l)
		}
	}
	b.leases.mu.Unlock()
	var errs []error
	for _, l := range mine {
		b.leases.mu.Lock()
		done := l.renewing
		b.leases.mu.Unlock()
		if done != nil {
			select {
			case <-done:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		b.leases.mu.Lock()
		l.held, l.stopRenew, l.renewing = false, nil, nil
		b.leases.mu.Unlock()
		if err := b.release(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *Backend) release(ctx context.Context, l *lease) error {
	lock := b.lock(l)
	getCtx, cancel := b.call(ctx)
	old, _, err := lock.Get(getCtx)
	cancel()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot release lease %s/%s: %w", l.ns, l.name, err)
	}
	if old.HolderIdentity != b.Identity() {
		return nil
	}
	now := metav1.NewTime(time.Now())
	updCtx, cancel := b.call(ctx)
	err = lock.Update(updCtx, resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now, LeaderTransitions: old.LeaderTransitions})
	cancel()
	if err != nil {
		return fmt.Errorf("cannot release lease %s/%s: %w", l.ns, l.name, err)
	}
	return nil
}

// LeaseHolder is who holds agent's lease in ns as the API server says now
// ("" when nobody does or it is not there), for status and explain.
func (b *Backend) LeaseHolder(ctx context.Context, ns, agent string) (string, error) {
	lock := b.lock(&lease{ns: ns, name: LeaseName(agent), agent: agent})
	getCtx, cancel := b.call(ctx)
	defer cancel()
	rec, _, err := lock.Get(getCtx)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("cannot read lease %s/%s: %w", ns, LeaseName(agent), err)
	}
	return rec.HolderIdentity, nil
}

// explainLease is what Explain says of the agent's lease: from memory,
// with no API call.
func (b *Backend) explainLease(p isolation.Plan) string {
	if b.host == "" {
		return ""
	}
	name := LeaseName(p.AgentID)
	b.leases.mu.Lock()
	l := b.leases.by[p.Kube.Namespace+"/"+name]
	var seen string
	switch {
	case l == nil:
		seen = "not yet asked for (the agent's first run takes it)"
	case l.held:
		seen = "held by this host"
	case l.holder != "":
		seen = "held by " + l.holder + " when last read: this host refuses the agent's runs"
	default:
		seen = "not held"
	}
	b.leases.mu.Unlock()
	return fmt.Sprintf("one berth host per agent: runs start only while this host (%s) holds Lease %s/%s (%s; renewed every %s, lapses %s after its holder's last renewal); pods carry %s=%s and this host's sweep and kills touch no other host's pods",
		b.Identity(), p.Kube.Namespace, name, seen, leaseRenew, LeaseDuration, LabelHost, b.host)
}
