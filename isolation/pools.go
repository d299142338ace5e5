package isolation

import (
	"slices"
	"strings"
)

// PoolReporter is a backend that keeps warm pools (container, kubernetes):
// what each agent's pool holds and how often a run found it empty. The
// scheduler's metrics read it without knowing the backend (ADR 23).
type PoolReporter interface {
	PoolStats() []PoolStat
}

// PoolStat is one agent's warm pool.
type PoolStat struct {
	Agent string
	// Waiting is how many sandboxes wait for a request now; Size is how
	// many the pool keeps (the agent's warm setting).
	Waiting, Size int
	// Hits and Misses count the runs, since the backend was made, that
	// asked the pool for a sandbox and got one, or got none and started
	// their own.
	Hits, Misses uint64
}

// PoolTakes counts, by agent, the runs that asked a warm pool for a
// sandbox. The backend's pool mutex guards it.
type PoolTakes map[string]*PoolStat

// Count counts one run of agent that got a waiting sandbox (hit) or none.
func (t *PoolTakes) Count(agent string, hit bool) {
	if *t == nil {
		*t = PoolTakes{}
	}
	st := (*t)[agent]
	if st == nil {
		st = &PoolStat{Agent: agent}
		(*t)[agent] = st
	}
	if hit {
		st.Hits++
	} else {
		st.Misses++
	}
}

// Stats are the pools of every agent in sizes (agent → waiting, size) or
// in t, sorted by agent.
func (t PoolTakes) Stats(sizes map[string][2]int) []PoolStat {
	byAgent := map[string]PoolStat{}
	for agent, st := range t {
		byAgent[agent] = *st
	}
	for agent, sz := range sizes {
		st := byAgent[agent]
		st.Agent, st.Waiting, st.Size = agent, sz[0], sz[1]
		byAgent[agent] = st
	}
	out := make([]PoolStat, 0, len(byAgent))
	for _, st := range byAgent {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PoolStat) int { return strings.Compare(a.Agent, b.Agent) })
	return out
}
