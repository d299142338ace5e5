package scheduler

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// queueView is the dispatcher's memory of queue/: the queued runs of each
// agent in FIFO order, and how far queue/ has been read. With it a pass
// reads only the queue entries added since the one before and looks at the
// first run of each agent that is free, so that a long queue of a busy
// agent costs nothing per pass (it used to cost a decode of every queued
// run).
//
// It can be this simple because queue/ changes in few ways while the
// dispatcher runs: a Submit adds an entry under a key larger than every
// earlier one (NextSequence); a claim, a CancelRun or a quarantine removes
// one. The two writes that put a run back under its old key (reconcile, and
// the requeue of a graceful stop) happen before and after the dispatch
// loop, and Run starts each loop with an empty view. An entry the view still
// holds after it left queue/ is dropped when it comes to the front.
//
// Only the dispatcher uses it: claimFromView runs inside its write and
// changes nothing; claim applies the result after the commit, so a group
// applied twice or a failed commit leaves the view as it was.
type queueView struct {
	byAgent map[string][]queueEntry // nil: read queue/ from the start
	next    uint64                  // queue keys below it have been read
}

type queueEntry struct {
	seq uint64
	id  string
}

// reset makes the next pass read queue/ from the start.
func (v *queueView) reset() { *v = queueView{} }

// viewUpdate is what one pass learnt: applied to the view once its write is
// committed.
type viewUpdate struct {
	fresh map[string][]queueEntry // entries read this pass, by agent
	taken map[string]int          // entries consumed from the front of each agent's line
	// passed are entries among those taken that stay queued, in order, at
	// the front of their agent's line: runs of a conversation whose sandbox
	// is busy, passed over so the agent's other conversations can start.
	passed map[string][]queueEntry
	next   uint64
}

func (v *queueView) apply(u viewUpdate) {
	if v.byAgent == nil {
		v.byAgent = map[string][]queueEntry{}
	}
	for agent, fresh := range u.fresh {
		v.byAgent[agent] = append(v.byAgent[agent], fresh...)
	}
	for agent, n := range u.taken {
		line := v.byAgent[agent][n:]
		if passed := u.passed[agent]; len(passed) > 0 {
			line = append(append(make([]queueEntry, 0, len(passed)+len(line)), passed...), line...)
		}
		if len(line) == 0 {
			delete(v.byAgent, agent)
			continue
		}
		v.byAgent[agent] = line
	}
	v.next = u.next
}

// claimFromView marks up to n queued runs as running, in FIFO order, at most
// one per agent and none of an agent in busy (which it extends). It decodes
// the runs added to queue/ since the last pass (for their agents) and the
// runs it claims. A queue entry without its queued run is dropped (with the
// run's index entries, as unindexRun does); an undecodable run is returned
// in bad, for quarantine.
//
// admit, when set, decides for each run at the front of its agent's line:
// a run it refuses stays at the front and its agent starts nothing more in
// this pass, unless it refuses it as parallel (its conversation's sandbox is
// busy): then the run stays queued where it is and the agent's next run is
// looked at, so one busy conversation holds up none of the others; a run it
// admits as parallel leaves its agent free for more.
func (v *queueView) claimFromView(tx *bolt.Tx, n int, busy map[string]bool, admit func(*bolt.Tx, Run) (ok, parallel bool, err error), now time.Time) (claimed []Run, bad []*corruptRecord, u viewUpdate, err error) {
	u = viewUpdate{fresh: map[string][]queueEntry{}, taken: map[string]int{}, passed: map[string][]queueEntry{}, next: v.next}
	if v.byAgent == nil {
		u.next = 0
	}
	type staleEntry struct{ id, agent string }
	var stale []staleEntry
	c := queueBucket(tx).Cursor()
	for k, val := c.Seek(u64(u.next)); k != nil; k, val = c.Next() {
		seq, id := binary.BigEndian.Uint64(k), string(val)
		u.next = seq + 1
		r, ok, err := getRun(tx, id)
		if cr, isBad := asCorrupt(err); isBad {
			bad = append(bad, cr)
			continue
		}
		if err != nil {
			return nil, nil, viewUpdate{}, err
		}
		if !ok || r.State != StateQueued {
			stale = append(stale, staleEntry{id: id, agent: r.Agent})
			continue
		}
		u.fresh[r.Agent] = append(u.fresh[r.Agent], queueEntry{seq: seq, id: id})
	}
	// Written after the walk: a cursor must not move over keys it deletes.
	for _, e := range stale {
		// A queue entry left without its run: drop it.
		if err := unindexRun(tx, e.id, e.agent); err != nil {
			return nil, nil, viewUpdate{}, err
		}
	}

	// entryAt is the ith entry of agent's line: the view's, then this
	// pass's.
	entryAt := func(agent string, i int) (queueEntry, bool) {
		old := v.byAgent[agent]
		if i < len(old) {
			return old[i], true
		}
		if i -= len(old); i < len(u.fresh[agent]) {
			return u.fresh[agent][i], true
		}
		return queueEntry{}, false
	}
	agents := make([]string, 0, len(v.byAgent)+len(u.fresh))
	for agent := range v.byAgent {
		agents = append(agents, agent)
	}
	for agent := range u.fresh {
		if _, known := v.byAgent[agent]; !known {
			agents = append(agents, agent)
		}
	}
	for len(claimed) < n {
		// The oldest first entry among the free agents.
		var head queueEntry
		headAgent := ""
		for _, agent := range agents {
			if busy[agent] {
				continue
			}
			if e, ok := entryAt(agent, u.taken[agent]); ok && (headAgent == "" || e.seq < head.seq) {
				head, headAgent = e, agent
			}
		}
		if headAgent == "" {
			break
		}
		u.taken[headAgent]++
		if q := queueBucket(tx).Get(u64(head.seq)); string(q) != head.id {
			continue // canceled or quarantined since it was read
		}
		r, ok, err := getRun(tx, head.id)
		if cr, isBad := asCorrupt(err); isBad {
			bad = append(bad, cr)
			continue
		}
		if err != nil {
			return nil, nil, viewUpdate{}, err
		}
		if !ok || r.State != StateQueued {
			if err := unindexRun(tx, head.id, r.Agent); err != nil {
				return nil, nil, viewUpdate{}, err
			}
			continue
		}
		parallel := false
		if admit != nil {
			ok, par, err := admit(tx, r)
			if err != nil {
				return nil, nil, viewUpdate{}, err
			}
			if !ok && par {
				// Its conversation is busy: passed over, kept in its place.
				u.passed[headAgent] = append(u.passed[headAgent], head)
				continue
			}
			if !ok {
				u.taken[headAgent]-- // it stays at the front of its line
				busy[r.Agent] = true
				continue
			}
			parallel = par
		}
		if !parallel {
			busy[r.Agent] = true
		}
		r.State = StateRunning
		r.Attempts++
		// A record from before Attempt existed counts its earlier starts.
		r.Attempt = max(r.Attempt, r.Attempts-1) + 1
		r.StartedAt = now
		r.Handle = ""
		if err := putRun(tx, r); err != nil {
			return nil, nil, viewUpdate{}, fmt.Errorf("cannot start run %s: %w", r.ID, err)
		}
		claimed = append(claimed, r)
	}
	return claimed, bad, u, nil
}
