package egress

import (
	"cmp"
	"slices"

	"github.com/berth-dev/berth/isolation"
)

// record is a run's egress record as it grows: every decision counted, the
// first and last ones and the refusals kept (isolation.EgressFirstKept).
type record struct {
	seen     int
	first    []numbered
	refusals []numbered // after the first ones, up to EgressRefusalsKept
	last     []numbered // a ring of the latest EgressLastKept
	next     int        // where the ring writes next
	counts   isolation.EgressCounts
	hostAt   map[string]int // index in counts.Hosts
}

// numbered is a decision with its place in the run, so the kept ones merge
// back in order and none is kept twice.
type numbered struct {
	n int
	d isolation.EgressDecision
}

func (r *record) add(d isolation.EgressDecision) {
	nd := numbered{r.seen, d}
	r.seen++
	r.count(d)
	if len(r.first) < isolation.EgressFirstKept {
		r.first = append(r.first, nd)
		return
	}
	if !d.Allowed && len(r.refusals) < isolation.EgressRefusalsKept {
		r.refusals = append(r.refusals, nd)
	}
	if len(r.last) < isolation.EgressLastKept {
		r.last = append(r.last, nd)
		return
	}
	r.last[r.next] = nd
	r.next = (r.next + 1) % isolation.EgressLastKept
}

func (r *record) count(d isolation.EgressDecision) {
	if r.hostAt == nil {
		r.hostAt = map[string]int{}
	}
	c := &r.counts.OtherHosts
	if i, ok := r.hostAt[d.Host]; ok {
		c = &r.counts.Hosts[i]
	} else if len(r.counts.Hosts) < isolation.EgressHostsCounted {
		r.hostAt[d.Host] = len(r.counts.Hosts)
		r.counts.Hosts = append(r.counts.Hosts, isolation.EgressHostCount{Host: d.Host})
		c = &r.counts.Hosts[len(r.counts.Hosts)-1]
	}
	r.counts.BytesUp += d.BytesUp
	r.counts.BytesDown += d.BytesDown
	if d.Allowed {
		r.counts.Allowed++
		c.Allowed++
	} else {
		r.counts.Refused++
		c.Refused++
	}
}

// result is the kept decisions in the order they were made, how many were
// not kept, and the counts (hosts with the most requests first).
func (r *record) result() ([]isolation.EgressDecision, int, isolation.EgressCounts) {
	all := slices.Concat(r.first, r.refusals, r.last)
	slices.SortFunc(all, func(a, b numbered) int { return cmp.Compare(a.n, b.n) })
	all = slices.CompactFunc(all, func(a, b numbered) bool { return a.n == b.n })
	kept := make([]isolation.EgressDecision, len(all))
	for i, nd := range all {
		kept[i] = nd.d
	}
	counts := r.counts
	counts.Hosts = slices.Clone(counts.Hosts)
	slices.SortStableFunc(counts.Hosts, func(a, b isolation.EgressHostCount) int {
		return cmp.Compare(b.Allowed+b.Refused, a.Allowed+a.Refused)
	})
	return kept, r.seen - len(kept), counts
}
