package runprep

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// Sweeper is a backend that finds its sandboxes by itself (containers carry
// their run id and attempt in labels), so it can remove what a crashed
// scheduler left behind even when no handle was recorded for it.
type Sweeper interface {
	// Sweep removes the sandboxes whose run and attempt live does not claim
	// and returns their run ids.
	Sweep(ctx context.Context, live func(runID string, attempt int) bool) ([]string, error)
}

// sweepTimeout bounds one sweep of one backend.
const sweepTimeout = 30 * time.Second

// Sweep is one pass over the egress directories and every sweeping
// backend, removing what is not of an attempt live claims. Each backend is
// bounded by sweepTimeout, so an engine that does not answer holds up
// nothing but its own sweep.
func (p *Preparer) Sweep(ctx context.Context, live func(runID string, attempt int) bool) {
	p.sweepEgressDirs(live)
	swept := map[isolation.Backend]bool{}
	for name, b := range p.opts.Backends {
		sw, ok := b.(Sweeper)
		if !ok || swept[b] {
			continue
		}
		swept[b] = true
		p.sweep(ctx, name, sw, live)
	}
}

func (p *Preparer) sweep(ctx context.Context, name string, sw Sweeper, live func(string, int) bool) {
	sweepCtx, cancel := context.WithTimeout(ctx, sweepTimeout)
	removed, err := sw.Sweep(sweepCtx, live)
	cancel()
	for _, run := range removed {
		p.log.Warn("removed a sandbox left behind by an earlier attempt or scheduler", "backend", name, "run_id", run)
	}
	if err != nil && ctx.Err() == nil { // not a stop
		// Some were not removed: they keep running (and using the agent's
		// workspace) until a later sweep removes them.
		p.log.Error("cannot remove every sandbox left behind by an earlier attempt or scheduler; the next sweep tries again", "backend", name, "removed", len(removed), "err", err)
	}
}

// sweepEgressDirs removes the egress socket directories that are not of a
// live attempt (named isolation.AttemptName): a crashed scheduler's proxies
// ended with it (their stdin closed), their directories did not.
func (p *Preparer) sweepEgressDirs(live func(string, int) bool) {
	root := p.egressRoot()
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || live(isolation.ParseAttemptName(e.Name())) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			p.log.Warn("cannot remove an egress directory left behind", "directory", e.Name(), "err", err)
		}
	}
}
