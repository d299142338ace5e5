package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/runprep"
	"github.com/berth-dev/berth/isolation"
)

// Conversation sandboxes (issue 22, ADR 21): an agent with [agents.sandbox]
// scope = "conversation" runs each message in the kept sandbox of its
// (connector, channel, thread), started on its conversation's first message
// and stopped idle_stop after its last activity (a run, an egress request),
// after the run under way once it is max_lifetime old, or to make room for
// another conversation when max_per_agent of the agent's are alive. Each is
// recorded in sandboxes/ before its agent reads anything; a restarted
// scheduler kills every recorded one (its proxy and pipes died with the
// process that made it, ADR 21).

// bucketSandboxes is sandboxes/: sandbox id → JSON sandboxRecord. Made by
// the first sandbox, in its own transaction.
var bucketSandboxes = []byte("sandboxes")

// sandboxRecord is what a restarted scheduler needs to end a sandbox, and
// what ListSandboxes shows of it.
type sandboxRecord struct {
	ID           string    `json:"id"`
	Agent        string    `json:"agent"`
	Connector    string    `json:"connector,omitempty"`
	Channel      string    `json:"channel,omitempty"`
	Thread       string    `json:"thread,omitempty"`
	Backend      string    `json:"backend"`
	Handle       string    `json:"handle"`
	StartedAt    time.Time `json:"started_at"`
	LastActivity time.Time `json:"last_activity"`
	Runs         int       `json:"runs"`
}

// Timing of the sandboxes.
const (
	// reapInterval is how often the reaper looks: within a second of
	// idle_stop, which is within a quarter of any idle_stop config allows.
	reapInterval = time.Second
	// sandboxGrace is how long a stopped sandbox's processes have between
	// SIGTERM and SIGKILL.
	sandboxGrace = 10 * time.Second
)

// sandboxConv is the conversation whose sandbox a run belongs in.
type sandboxConv struct{ agent, connector, channel, thread string }

func sandboxConvOf(r Run) sandboxConv {
	return sandboxConv{agent: r.Agent, connector: r.Connector, channel: r.Channel, thread: r.Thread}
}

// sandbox is one conversation's sandbox in this process.
type sandbox struct {
	id   string
	conv sandboxConv

	// Set once started (under sandboxes.mu); nil while it is starting.
	prep    *runprep.PreparedKept
	kept    isolation.Kept
	backend string
	handle  string
	started time.Time
	// lifetime and idle are the agent's max_lifetime and idle_stop when it
	// started.
	lifetime, idle time.Duration

	// Under sandboxes.mu.
	busy bool      // a run holds it: claimed, not finished
	last time.Time // its latest activity, on the scheduler's clock
	runs int

	// current is the run it serves now: its proxy's asks are that run's
	// (approvals.go).
	current atomic.Pointer[Run]

	stopOnce sync.Once
	ended    chan struct{} // closed once it is stopped and forgotten

	// spend is its egress proxy's account of provider calls (usage.go);
	// set before it starts, nil without one.
	spend *spend
}

// sandboxClaim is what the dispatcher decided for a run of a conversation
// agent: its sandbox, one of another conversation to stop first, and what
// the run record says of it.
type sandboxClaim struct {
	sb    *sandbox
	evict *sandbox
	// fellBack: the run ran in a sandbox of its own, as with scope
	// "message" (runInSandbox).
	fellBack bool

	mu   sync.Mutex
	note []string
}

func (c *sandboxClaim) addNote(format string, args ...any) {
	c.mu.Lock()
	c.note = append(c.note, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *sandboxClaim) notes() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.note, "; ")
}

// sandboxes are the live sandboxes of this process. mu guards only these
// maps and the sandboxes' mutable fields: no backend call, transaction or
// bus call is made under it.
type sandboxes struct {
	mu     sync.Mutex
	byConv map[sandboxConv]*sandbox
	claims map[string]*sandboxClaim // run id → its claim, until its outcome is recorded
}

func newSandboxes() *sandboxes {
	return &sandboxes{byConv: map[sandboxConv]*sandbox{}, claims: map[string]*sandboxClaim{}}
}

// claimOf is run runID's claim, nil when it runs in a sandbox of its own.
func (m *sandboxes) claimOf(runID string) *sandboxClaim {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.claims[runID]
}

func (m *sandboxes) forgetClaim(runID string) {
	m.mu.Lock()
	delete(m.claims, runID)
	m.mu.Unlock()
}

// live tells the sweep that a sandbox of this process uses what is named
// by its id (its cgroup, container, egress directory).
func (m *sandboxes) live(id string, attempt int) bool {
	if attempt != 1 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.byConv {
		if sb.id == id {
			return true
		}
	}
	return false
}

// touch records activity of sb at now.
func (m *sandboxes) touch(sb *sandbox, now time.Time) {
	m.mu.Lock()
	if now.After(sb.last) {
		sb.last = now
	}
	m.mu.Unlock()
}

// remove forgets sb if it is still its conversation's.
func (m *sandboxes) remove(sb *sandbox) {
	m.mu.Lock()
	if m.byConv[sb.conv] == sb {
		delete(m.byConv, sb.conv)
	}
	m.mu.Unlock()
}

// sandboxView is a sandbox as one claim sees it.
type sandboxView struct {
	sb      *sandbox // nil: started by this claim
	conv    sandboxConv
	busy    bool
	last    time.Time
	evicted bool
}

// sandboxPlan decides, inside one claim's transaction, which queued runs of
// conversation agents may start. It changes nothing but its own views and
// the waiting runs' notes; the claim applies it after the commit, so a
// group applied twice starts over from a fresh plan.
type sandboxPlan struct {
	cfg      *config.Config
	now      time.Time
	byConv   map[sandboxConv]*sandboxView
	perAgent map[string][]*sandboxView
	decided  map[string]*sandboxDecision // run id → what it runs in
}

type sandboxDecision struct {
	view  *sandboxView
	evict *sandboxView
	note  string
}

// plan snapshots the live sandboxes for one claim.
func (m *sandboxes) plan(cfg *config.Config, now time.Time) *sandboxPlan {
	p := &sandboxPlan{cfg: cfg, now: now, byConv: map[sandboxConv]*sandboxView{}, perAgent: map[string][]*sandboxView{}, decided: map[string]*sandboxDecision{}}
	m.mu.Lock()
	defer m.mu.Unlock()
	for c, sb := range m.byConv {
		v := &sandboxView{sb: sb, conv: c, busy: sb.busy, last: sb.last}
		p.byConv[c] = v
		p.perAgent[c.agent] = append(p.perAgent[c.agent], v)
	}
	return p
}

// admit decides for the first queued run r of its agent (queueView). A run
// of an agent without conversation sandboxes is admitted as before, one
// per agent (parallel false). A conversation's run is admitted when its
// conversation has no run under way and its sandbox is alive or may be
// started: under max_per_agent, or by stopping the agent's sandbox idle
// the longest. A run whose conversation's sandbox is busy waits in its
// place while the agent's other conversations go on; a run for which every
// sandbox is busy holds its agent's line (FIFO, never starving), and its
// record says why.
func (p *sandboxPlan) admit(tx *bolt.Tx, r Run) (ok, parallel bool, err error) {
	a, err := p.cfg.Agent(r.Agent)
	if err != nil || !a.Sandbox.Conversation() {
		return true, false, nil
	}
	if r.overridden() {
		// A kept sandbox's proxy allows the agent's model and its lifetime
		// is not the job's max_runtime: such a run gets a sandbox of its own.
		return true, false, nil
	}
	c := sandboxConvOf(r)
	if v := p.byConv[c]; v != nil {
		if v.busy {
			// Its sandbox takes one request at a time; the agent's other
			// conversations go on (parallel: passed over, not blocking).
			return false, true, nil
		}
		v.busy = true
		p.decided[r.ID] = &sandboxDecision{view: v}
		return true, true, nil
	}
	fresh := &sandboxView{conv: c, busy: true}
	live := p.perAgent[r.Agent]
	if len(live) < a.Sandbox.MaxPerAgent {
		p.perAgent[r.Agent] = append(live, fresh)
		p.byConv[c] = fresh
		p.decided[r.ID] = &sandboxDecision{view: fresh}
		return true, true, nil
	}
	var victim *sandboxView
	for _, v := range live {
		if !v.busy && (victim == nil || v.last.Before(victim.last)) {
			victim = v
		}
	}
	if victim == nil {
		note := fmt.Sprintf("waited in the queue: all %d sandboxes of agent %s were busy (max_per_agent)", a.Sandbox.MaxPerAgent, r.Agent)
		if r.SandboxNote != note {
			r.SandboxNote = note
			if err := putRun(tx, r); err != nil {
				return false, false, err
			}
		}
		return false, false, nil // every sandbox busy: the agent's line waits, FIFO
	}
	victim.evicted = true
	delete(p.byConv, victim.conv)
	rest := make([]*sandboxView, 0, len(live))
	for _, v := range live {
		if v != victim {
			rest = append(rest, v)
		}
	}
	p.perAgent[r.Agent] = append(rest, fresh)
	p.byConv[c] = fresh
	p.decided[r.ID] = &sandboxDecision{view: fresh, evict: victim,
		note: fmt.Sprintf("the agent's sandbox idle the longest (%s, idle for %s) was stopped to make room (max_per_agent %d)",
			victim.sb.id, p.now.Sub(victim.last).Round(time.Second), a.Sandbox.MaxPerAgent)}
	return true, true, nil
}

// apply registers what plan decided for the claimed runs, after their
// claim is committed: a sandbox to start is in the listing (busy, not yet
// started) before its run goroutine begins, and a sandbox to stop first is
// gone from it.
func (m *sandboxes) apply(p *sandboxPlan, claimed []Run, newID func() string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range claimed {
		d := p.decided[r.ID]
		if d == nil {
			continue
		}
		claim := &sandboxClaim{}
		if d.note != "" {
			claim.note = append(claim.note, d.note)
		}
		if d.evict != nil && m.byConv[d.evict.conv] == d.evict.sb {
			delete(m.byConv, d.evict.conv)
			claim.evict = d.evict.sb
		}
		sb := d.view.sb
		if sb == nil || m.byConv[sb.conv] != sb {
			// A new conversation, or its sandbox stopped since the plan.
			sb = &sandbox{id: newID(), conv: d.view.conv, ended: make(chan struct{})}
			m.byConv[sb.conv] = sb
		}
		sb.busy = true
		claim.sb = sb
		m.claims[r.ID] = claim
	}
}

// sandboxID names a new sandbox: a run id's form (it names what the
// sandbox leaves on the host as a run id does) with its own prefix.
func (s *Service) sandboxID() string { return "sbx_" + newRunID(s.clock.Now()) }

// runInSandbox runs r in its conversation's sandbox (claim), starting it
// first when it is new, and stops it after the run when the run failed or
// it reached max_lifetime.
func (s *Service) runInSandbox(ctx context.Context, r Run, cfg *config.Config, claim *sandboxClaim) (res runOutcome, backend string, err error) {
	if claim.evict != nil {
		s.stopSandbox(claim.evict, "stopped to make room for another conversation (max_per_agent)")
	}
	sb := claim.sb
	s.sandboxes.mu.Lock()
	kept, prep := sb.kept, sb.prep
	backend = sb.backend
	s.sandboxes.mu.Unlock()
	if kept == nil {
		started := sandboxStart(ctx)
		backend, err = s.startSandbox(ctx, r, cfg, sb)
		started(err)
		if err != nil {
			s.sandboxes.remove(sb)
			s.sandboxes.mu.Lock()
			sb.busy = false
			s.sandboxes.mu.Unlock()
			if isolation.ReasonOf(err) == isolation.ReasonNoBackend {
				// This backend cannot keep a sandbox here (a host backend
				// under systemd, a backend without Keeper): the message
				// still gets its answer, in a fresh sandbox of its own.
				claim.addNote("ran in a fresh sandbox of its own: %v", err)
				claim.fellBack = true
				return s.runOnce(ctx, r, cfg)
			}
			return res, backend, err
		}
		s.sandboxes.mu.Lock()
		kept, prep = sb.kept, sb.prep
		s.sandboxes.mu.Unlock()
	}
	s.log.Info("run in its conversation's sandbox", "run_id", r.ID, "agent", r.Agent, "sandbox_id", sb.id)
	s.sandboxes.touch(sb, s.clock.Now())
	req, refusedMCP := s.runRequest(r, prep.Agent, prep.Plan)
	s.newSpendRun(sb.spend) // cost_per_run starts again for this run
	sb.current.Store(&r)
	if req.Message.Files, err = s.placeFiles(r, prep.Plan); err == nil {
		res.Result, err = s.runKept(ctx, cfg, r, kept, prep.Plan, req)
	}
	s.endApprovals(r.ID)
	res.Response.MCP = append(refusedMCP, res.Response.MCP...)
	if err == nil && res.Response.Error == "" {
		res.files = s.takeReplyFiles(cfg, r, prep.Plan, isolation.KnownSecrets(prep.OpeningSpec(req.Agent, nil)), res.Result)
	}
	rec := prep.CutEgress()
	res.Egress, res.EgressDropped, res.EgressCounts = rec.Decisions, rec.Dropped, rec.Counts
	res.Usage = rec.Usage

	now := s.clock.Now()
	ended := false
	select {
	case <-kept.Done():
		ended = true
	default:
	}
	s.sandboxes.mu.Lock()
	sb.runs++
	if now.After(sb.last) {
		sb.last = now
	}
	retire := !ended && sb.lifetime > 0 && now.Sub(sb.started) >= sb.lifetime
	if ended || retire {
		// Gone from the listing before its conversation's next message is
		// claimed: that one gets a fresh sandbox.
		if s.sandboxes.byConv[sb.conv] == sb {
			delete(s.sandboxes.byConv, sb.conv)
		}
	}
	sb.busy = false
	s.sandboxes.mu.Unlock()
	switch {
	case ended:
		claim.addNote("the sandbox %s was stopped after this run failed; the conversation's next message gets a fresh one", sb.id)
		s.stopSandbox(sb, "its run failed")
	case retire:
		claim.addNote("the sandbox %s reached max_lifetime (%s) and was stopped after this run; the conversation's next message gets a fresh one (its /workspace stays)", sb.id, sb.lifetime)
		s.stopSandbox(sb, "reached max_lifetime")
	default:
		s.saveSandbox(sb)
	}
	s.emitSandboxesChanged()
	wake(s.wakeDispatch)
	return res, backend, err
}

// startSandbox prepares and starts sb for r's agent, recording it (with its
// handle) before its agent reads anything.
func (s *Service) startSandbox(ctx context.Context, r Run, cfg *config.Config, sb *sandbox) (backend string, err error) {
	a, err := cfg.Agent(r.Agent)
	if err != nil {
		return "", &isolation.RunError{Reason: isolation.ReasonAgentNotConfigured, Err: err}
	}
	sp, spending := s.beginSpend(cfg, r.Agent)
	sb.current.Store(&r)
	runOf := func() Run { return *sb.current.Load() }
	var answerTo atomic.Pointer[runprep.PreparedKept]
	prep, err := s.prep.PrepareKept(ctx, runprep.KeptInput{
		Input: runprep.Input{Config: cfg, Agent: r.Agent, RunID: sb.id, Attempt: 1, Spending: spending,
			OnAsk: s.onAsk(runOf, approvalTimeout(cfg, r.Agent), func(a egresspolicy.Answer) error {
				if p := answerTo.Load(); p != nil {
					return p.Answer(a)
				}
				return errors.New("the sandbox has not started")
			}),
			OnAskSettled: s.onAskSettled(runOf)},
		Lifetime: a.Sandbox.MaxLifetime,
		// Every egress request is activity: a tool that calls out keeps
		// its sandbox alive, however long ago the last message was.
		OnEgress: func(isolation.EgressDecision) { s.sandboxes.touch(sb, s.clock.Now()) },
	})
	answerTo.Store(prep)
	if prep != nil {
		backend = prep.Backend.Name()
	}
	if err != nil {
		s.endSpend(sp)
		return backend, err
	}
	sp.attach(prep)
	sb.spend = sp
	started := s.clock.Now()
	s.sandboxes.mu.Lock()
	sb.backend, sb.started, sb.last = backend, started, started
	sb.lifetime, sb.idle = a.Sandbox.MaxLifetime, a.Sandbox.IdleStop
	s.sandboxes.mu.Unlock()
	spec := prep.OpeningSpec(agentproto.Agent{
		ID: a.ID, Name: a.Name, MaxIterations: a.MaxIterations,
		Tools: runplan.AgentTools(a),
	}, func(handle string) error {
		s.sandboxes.mu.Lock()
		sb.handle = handle
		s.sandboxes.mu.Unlock()
		if err := s.saveSandbox(sb); err != nil {
			s.log.Error("cannot record a sandbox; it is stopped", "sandbox_id", sb.id, "agent", r.Agent, "err", err)
			return err
		}
		return nil
	})
	kept, err := prep.Keeper.Start(ctx, spec)
	if err != nil {
		prep.Finish()
		s.endSpend(sp)
		s.deleteSandbox(sb.id)
		s.log.Warn("cannot start a conversation's sandbox", "sandbox_id", sb.id, "agent", r.Agent, "run_id", r.ID, "err", err)
		return backend, err
	}
	s.sandboxes.mu.Lock()
	sb.kept, sb.prep = kept, prep
	s.sandboxes.mu.Unlock()
	s.log.Info("sandbox started", "sandbox_id", sb.id, "agent", r.Agent, "connector", r.Connector, "channel", r.Channel, "thread", r.Thread, "backend", backend, "run_id", r.ID)
	s.emitSandboxesChanged()
	return backend, nil
}

// stopSandbox ends sb (SIGTERM, grace, SIGKILL), its egress proxy and its
// record, once; a second call waits for the first.
func (s *Service) stopSandbox(sb *sandbox, why string) {
	s.sandboxes.remove(sb)
	sb.stopOnce.Do(func() {
		s.sandboxes.mu.Lock()
		kept, prep, runs := sb.kept, sb.prep, sb.runs
		s.sandboxes.mu.Unlock()
		if kept != nil {
			ctx, cancel := context.WithTimeout(context.Background(), sandboxGrace+killTimeout)
			if err := kept.Stop(ctx, sandboxGrace); err != nil {
				s.log.Warn("cannot stop a sandbox cleanly", "sandbox_id", sb.id, "agent", sb.conv.agent, "err", err)
			}
			cancel()
		}
		if prep != nil {
			prep.Finish()
		}
		s.endSpend(sb.spend)
		s.deleteSandbox(sb.id)
		s.log.Info("sandbox stopped", "sandbox_id", sb.id, "agent", sb.conv.agent, "reason", why, "runs", runs)
		close(sb.ended)
		s.emitSandboxesChanged()
	})
	<-sb.ended
}

// reapLoop stops idle and expired sandboxes until ctx is done.
func (s *Service) reapLoop(ctx context.Context) {
	ticker := s.clock.NewTicker(reapInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			s.reapSandboxes()
		}
	}
}

// reapSandboxes stops each sandbox without a run that has been idle
// idle_stop, or has lived max_lifetime, and each whose agent ended by
// itself (a crash, an OOM kill).
func (s *Service) reapSandboxes() {
	now := s.clock.Now()
	type reaped struct {
		sb  *sandbox
		why string
	}
	var stop []reaped
	s.sandboxes.mu.Lock()
	for c, sb := range s.sandboxes.byConv {
		if sb.busy || sb.kept == nil {
			continue
		}
		why := ""
		select {
		case <-sb.kept.Done():
			why = "its agent ended"
		default:
		}
		switch idle := now.Sub(sb.last); {
		case why != "":
		case sb.idle > 0 && idle >= sb.idle:
			why = fmt.Sprintf("idle for %s (idle_stop %s)", idle.Round(time.Second), sb.idle)
		case sb.lifetime > 0 && now.Sub(sb.started) >= sb.lifetime:
			why = fmt.Sprintf("reached max_lifetime (%s)", sb.lifetime)
		default:
			continue
		}
		delete(s.sandboxes.byConv, c)
		stop = append(stop, reaped{sb, why})
	}
	s.sandboxes.mu.Unlock()
	for _, r := range stop {
		s.stopSandbox(r.sb, r.why)
	}
	if len(stop) > 0 {
		wake(s.wakeDispatch)
	}
}

// stopAllSandboxes stops every sandbox of this process: the scheduler is
// stopping and its runs have ended.
func (s *Service) stopAllSandboxes() {
	s.sandboxes.mu.Lock()
	all := make([]*sandbox, 0, len(s.sandboxes.byConv))
	for _, sb := range s.sandboxes.byConv {
		all = append(all, sb)
	}
	s.sandboxes.mu.Unlock()
	var wg sync.WaitGroup
	for _, sb := range all {
		wg.Go(func() { s.stopSandbox(sb, "the scheduler is stopping") })
	}
	wg.Wait()
}

// removeRecordedSandboxes ends every sandbox an earlier process recorded
// (Backend.Kill by its handle) and forgets it: none is reattached, as its
// egress proxy and its pipes died with that process (ADR 21). A record
// whose sandbox cannot be killed now is kept for the next start.
func (s *Service) removeRecordedSandboxes(ctx context.Context) error {
	var recs []sandboxRecord
	err := s.store.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var rec sandboxRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				s.log.Error("cannot decode a sandbox record; dropping it (the sweep removes what it named)", "sandbox_id", string(k), "err", err)
				rec = sandboxRecord{ID: string(k)}
			}
			recs = append(recs, rec)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("cannot read the recorded sandboxes: %w", err)
	}
	for _, rec := range recs {
		if s.sandboxes.live(rec.ID, 1) {
			continue // this process's own (a Run after an earlier Run)
		}
		if rec.Handle != "" {
			b := s.opts.Backends[rec.Backend]
			if b == nil {
				s.log.Warn("cannot remove a sandbox left by an earlier scheduler: its backend is not available; kept for a later start",
					"sandbox_id", rec.ID, "agent", rec.Agent, "backend", rec.Backend, "handle", rec.Handle)
				continue
			}
			killCtx, cancel := context.WithTimeout(ctx, killTimeout)
			err := b.Kill(killCtx, rec.Handle)
			cancel()
			if err != nil {
				s.log.Warn("cannot remove a sandbox left by an earlier scheduler; kept for a later start",
					"sandbox_id", rec.ID, "agent", rec.Agent, "backend", rec.Backend, "handle", rec.Handle, "err", err)
				continue
			}
		}
		s.deleteSandbox(rec.ID)
		s.log.Warn("removed a sandbox left by an earlier scheduler", "sandbox_id", rec.ID, "agent", rec.Agent, "backend", rec.Backend, "runs", rec.Runs)
	}
	return nil
}

// saveSandbox writes sb's record, in a transaction of its own (a start,
// and a run's end, are rare next to the busy writes).
func (s *Service) saveSandbox(sb *sandbox) error {
	s.sandboxes.mu.Lock()
	rec := sandboxRecord{ID: sb.id, Agent: sb.conv.agent, Connector: sb.conv.connector, Channel: sb.conv.channel, Thread: sb.conv.thread,
		Backend: sb.backend, Handle: sb.handle, StartedAt: sb.started, LastActivity: sb.last, Runs: sb.runs}
	s.sandboxes.mu.Unlock()
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cannot encode sandbox %s: %w", sb.id, err)
	}
	err = s.store.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketSandboxes)
		if err != nil {
			return err
		}
		return b.Put([]byte(sb.id), data)
	})
	if err != nil {
		return fmt.Errorf("cannot record sandbox %s: %w", sb.id, err)
	}
	return nil
}

func (s *Service) deleteSandbox(id string) {
	err := s.store.update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketSandboxes); b != nil {
			return b.Delete([]byte(id))
		}
		return nil
	})
	if err != nil {
		s.log.Error("cannot forget a stopped sandbox; the next start removes it", "sandbox_id", id, "err", err)
	}
}

// SandboxInfo is one live sandbox as ListSandboxes shows it.
type SandboxInfo struct {
	ID           string
	Agent        string
	Connector    string
	Channel      string
	Thread       string
	Backend      string
	StartedAt    time.Time
	LastActivity time.Time
	IdleFor      time.Duration
	Busy         bool
	Runs         int
	MemoryBytes  int64 // -1 when it cannot be measured

	MemoryUnknown string // why MemoryBytes is -1
}

// ListSandboxes returns the live sandboxes of agent ("" for all), oldest
// first. Reading the listing is not activity.
func (s *Service) ListSandboxes(ctx context.Context, agent string) []SandboxInfo {
	now := s.clock.Now()
	type entry struct {
		info SandboxInfo
		kept isolation.Kept
	}
	var all []entry
	s.sandboxes.mu.Lock()
	for c, sb := range s.sandboxes.byConv {
		if sb.kept == nil || (agent != "" && c.agent != agent) {
			continue
		}
		idle := now.Sub(sb.last)
		if sb.busy {
			idle = 0
		}
		all = append(all, entry{SandboxInfo{ID: sb.id, Agent: c.agent, Connector: c.connector, Channel: c.channel, Thread: c.thread,
			Backend: sb.backend, StartedAt: sb.started, LastActivity: sb.last, IdleFor: idle, Busy: sb.busy, Runs: sb.runs}, sb.kept})
	}
	s.sandboxes.mu.Unlock()
	sort.Slice(all, func(i, j int) bool {
		return all[i].info.StartedAt.Before(all[j].info.StartedAt) || (all[i].info.StartedAt.Equal(all[j].info.StartedAt) && all[i].info.ID < all[j].info.ID)
	})
	out := make([]SandboxInfo, len(all))
	for i, e := range all {
		memCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		mem, err := e.kept.Memory(memCtx)
		cancel()
		if err != nil {
			mem = -1
			e.info.MemoryUnknown = err.Error()
		}
		e.info.MemoryBytes = mem
		out[i] = e.info
	}
	return out
}

// StopSandbox stops a live sandbox that has no run under way; its
// conversation's next message gets a fresh one.
func (s *Service) StopSandbox(id string) error {
	s.sandboxes.mu.Lock()
	var found *sandbox
	for _, sb := range s.sandboxes.byConv {
		if sb.id == id && sb.kept != nil {
			found = sb
		}
	}
	busy := found != nil && found.busy
	if found != nil && !busy {
		delete(s.sandboxes.byConv, found.conv)
	}
	s.sandboxes.mu.Unlock()
	switch {
	case found == nil:
		return fmt.Errorf("%w: no live sandbox %q", ErrNotFound, id)
	case busy:
		return fmt.Errorf("%w: sandbox %s has a run under way; cancel the run (berthctl runs cancel) or try again when it ends", ErrInvalidArgument, id)
	}
	s.stopSandbox(found, "stopped by StopSandbox")
	wake(s.wakeDispatch)
	return nil
}

// emitSandboxesChanged tells the bus that the listing changed (a sandbox
// started, ran, or stopped); listeners call ListSandboxes again. Called
// after the change, never under a lock or in a transaction.
func (s *Service) emitSandboxesChanged() {
	conn := s.bus()
	if conn == nil {
		return
	}
	if err := conn.Emit(bus.SchedulerPath, bus.SchedulerInterface+".SandboxesChanged"); err != nil {
		s.log.Debug("cannot emit SandboxesChanged", "err", err)
	}
}

// joinNotes joins a run's sandbox notes.
func joinNotes(notes ...string) string {
	var out []string
	for _, n := range notes {
		if n != "" {
			out = append(out, n)
		}
	}
	return strings.Join(out, "; ")
}
