package images

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/filestamp"
)

// Every container run asks EnsureIsolationImage, and a plan's hashes read
// the agent binary (tens of MB) and busybox through SHA-256 twice: ~60 ms a
// run, most of a warm run's time. planMemo keeps computed plans while what
// they were made of is unchanged: the target's settings, the base image's
// ID (asked of the engine every time), the version, and the agent binary and
// busybox as stat(2) sees them (device, inode, size, mtime and ctime: a
// rebuilt or replaced binary has another inode or ctime). A file that
// cannot be stat'ed is never memoized.

// planMemoMax bounds the memo (a plan per target: agents with image_config
// and the default).
const planMemoMax = 256

type planKey struct {
	target, settings, baseID, version string
	agentPath, busyboxPath            string
	agent, busybox                    filestamp.Stamp
}

// stampOf is the stamp of the file at path; no path has the zero Stamp.
func stampOf(path string) (filestamp.Stamp, bool) {
	if path == "" {
		return filestamp.Stamp{}, true
	}
	st, err := filestamp.Of(path)
	return st, err == nil
}

type planMemo struct {
	mu    sync.Mutex
	plans map[planKey]*plan
}

// key is the memo's key for a plan, false when it cannot be memoized.
func (m *planMemo) key(target string, settings any, baseID, version, agent, busybox string) (planKey, bool) {
	enc, err := json.Marshal(settings)
	if err != nil {
		return planKey{}, false
	}
	a, okA := stampOf(agent)
	b, okB := stampOf(busybox)
	return planKey{
		target: target, settings: string(enc), baseID: baseID, version: version,
		agentPath: agent, busyboxPath: busybox, agent: a, busybox: b,
	}, okA && okB
}

// get returns a copy of the memoized plan.
func (m *planMemo) get(k planKey) (*plan, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.plans[k]
	if !ok {
		return nil, false
	}
	cp := *p
	return &cp, true
}

func (m *planMemo) put(k planKey, p *plan) {
	cp := *p
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.plans == nil || len(m.plans) >= planMemoMax {
		m.plans = map[planKey]*plan{}
	}
	m.plans[k] = &cp
}

// usedEvery is how often a tag's last use is written to images.db.
const usedEvery = time.Minute
