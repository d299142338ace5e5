// Package container is the isolation backend that runs every request in a
// fresh Docker container, created through the Engine API
// (github.com/moby/moby/client, negotiating down to API 1.41 of Debian 12's
// docker.io) and removed when the run ends, whatever happened.
//
// The request goes to the container's stdin over an attach stream — never
// into Env, Cmd, labels or files — and the response comes back on stdout.
// Containers are hardened by default (read-only rootfs, CapDrop ALL,
// no-new-privileges, memory/pids/CPU limits, non-root user, no published
// ports, no engine socket) and berth-agent still confines itself with
// Landlock inside (isolation.ContainerPolicy).
//
// Every container carries labels: berth.run and berth.attempt (or
// berth.pool for a warm container that has no run yet), berth.agent,
// berth.config-hash and berth.instance (which scheduler made it), so Sweep
// can remove what a crashed scheduler left behind — a dead attempt of a run
// that is running again included — without touching anyone else's
// containers.
//
// With container_mode.warm = N the backend keeps N containers per agent
// started and blocked on their stdin (pool.go); a run takes one, and it is
// still removed after that one run.
//
// With Options.RemoveInBackground (berth-scheduler's setting) a run is
// answered as soon as berth-agent's response and log are complete
// (isolation.BackgroundEnder): waiting for the engine to report the exit,
// the OOM check and the removal are not in the reply's path. Drain waits
// for them; a crash leaves the container to Sweep.
package container

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/filestamp"
	"github.com/berth-dev/berth/isolation"
)

// Name is the backend's config name.
const Name = "container"

// Labels on every container berth creates.
const (
	LabelRun = "berth.run"
	// LabelAttempt is the number of the run's start the container is for
	// (isolation.Plan.Attempt): a run started again after a crash keeps
	// its berth.run.
	LabelAttempt    = "berth.attempt"
	LabelAgent      = "berth.agent"
	LabelConfigHash = "berth.config-hash"
	LabelInstance   = "berth.instance"
	// LabelPool marks a warm container started before any message reached
	// it; the value is the agent id. It has no berth.run label.
	LabelPool = "berth.pool"
)

const (
	// MaxResponse caps what is read from the agent's stdout.
	MaxResponse = isolation.MaxResponse
	// StderrTail is how much of the agent's stderr is kept.
	StderrTail = isolation.StderrTail
	// DefaultEngineTimeout bounds each short Engine API call (info, inspect,
	// create, attach, start, kill, remove, list): an engine that accepts
	// connections and never answers fails container runs with isolation.ReasonEngineUnavailable
	// instead of holding them forever.
	DefaultEngineTimeout = 20 * time.Second
	// DefaultBuildTimeout bounds building the berth-agent image.
	DefaultBuildTimeout = 10 * time.Minute
	handlePrefix        = "container:"
)

// Options configure the backend.
type Options struct {
	// Client talks to the engine; nil means client.New(client.FromEnv), which
	// negotiates the API version on first use.
	Client *client.Client
	// Instance names the scheduler that owns the containers (its state
	// directory, say); Sweep only removes containers of the same instance.
	Instance string
	// Busybox is the static busybox put into the agent image built for agents
	// without container_mode.image; "" means imagectl.DefaultBusybox.
	Busybox string
	// EngineTimeout bounds each short engine call; 0 means
	// DefaultEngineTimeout. BuildTimeout bounds an image build; 0 means
	// DefaultBuildTimeout.
	EngineTimeout time.Duration
	BuildTimeout  time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// RemoveInBackground ends a run's container after Run has returned
	// instead of before: Run returns as soon as berth-agent's response and
	// log are complete (isolation.BackgroundEnder; unless a tool died of
	// SIGKILL, which may be an OOM kill to wait for), and killing the
	// container, waiting for the engine to report its exit, the OOM check
	// and the removal (engine calls of tens to hundreds of milliseconds)
	// are not in the reply's path. Drain waits for what is under way; a
	// crash before it is done is what Sweep is for.
	RemoveInBackground bool
}

// Backend runs agents in containers.
type Backend struct {
	cli           *client.Client
	instance      string
	busybox       string
	engineTimeout time.Duration
	buildTimeout  time.Duration
	log           *slog.Logger

	// mu guards the caches only; it is never held across an engine call.
	mu     sync.Mutex
	info   *system.Info
	infoAt time.Time
	images map[agentBinary]string      // agent binary → image tag
	builds map[agentBinary]*imageBuild // agent binary → build under way

	removeInBackground bool
	removals           sync.WaitGroup // background removals under way

	poolMu  sync.Mutex
	pools   map[string]*pool    // agent id → its warm pool
	takes   isolation.PoolTakes // agent id → its runs' hits and misses of the pool
	owned   map[string]bool     // ids of containers this process still ends: warm ones it made, those ended after their run
	drained bool                // Drain ran and Warm did not since: no pool starts by itself
}

// imageBuild is one build of the berth-agent image that runs may wait for.
type imageBuild struct {
	done chan struct{}
	tag  string
	err  error
}

var _ isolation.Backend = (*Backend)(nil)

// New returns the container backend. It does not contact the engine: an
// engine that is down fails container runs, not the scheduler.
func New(opts Options) (*Backend, error) {
	cli := opts.Client
	if cli == nil {
		var err error
		if cli, err = imagectl.NewEngineClient(); err != nil {
			return nil, fmt.Errorf("cannot create Docker client: %w", err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.EngineTimeout <= 0 {
		opts.EngineTimeout = DefaultEngineTimeout
	}
	if opts.BuildTimeout <= 0 {
		opts.BuildTimeout = DefaultBuildTimeout
	}
	return &Backend{
		cli:                cli,
		instance:           InstanceLabel(opts.Instance),
		busybox:            opts.Busybox,
		engineTimeout:      opts.EngineTimeout,
		buildTimeout:       opts.BuildTimeout,
		log:                opts.Logger,
		removeInBackground: opts.RemoveInBackground,
		images:             map[agentBinary]string{},
		builds:             map[agentBinary]*imageBuild{},
		pools:              map[string]*pool{},
		owned:              map[string]bool{},
	}, nil
}

// InstanceLabel is the berth.instance value of a scheduler instance name.
func InstanceLabel(instance string) string {
	sum := sha256.Sum256([]byte(instance))
	return hex.EncodeToString(sum[:8])
}

// Client is the engine client the backend uses.
func (b *Backend) Client() *client.Client { return b.cli }

// Name returns "container".
func (b *Backend) Name() string { return Name }

// call is the context of one short engine call: ctx with the engine deadline.
func (b *Backend) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.engineTimeout)
}

// unavailable is the RunError of an engine that did not answer.
func (b *Backend) unavailable(what string, err error) *isolation.RunError {
	detail := fmt.Sprintf("cannot %s: the Docker engine at %s did not answer", what, b.cli.DaemonHost())
	if errors.Is(err, context.DeadlineExceeded) {
		detail += fmt.Sprintf(" within %s", b.engineTimeout)
	}
	return &isolation.RunError{Reason: isolation.ReasonEngineUnavailable,
		Detail: detail + "; start it (systemctl start docker) or point DOCKER_HOST at it; landlock agents are not affected",
		Err:    err}
}

// engineInfo returns the engine's info, cached for a little while: runtimes
// and architecture do not change between runs.
func (b *Backend) engineInfo(ctx context.Context) (system.Info, error) {
	b.mu.Lock()
	if b.info != nil && time.Since(b.infoAt) < time.Minute {
		info := *b.info
		b.mu.Unlock()
		return info, nil
	}
	b.mu.Unlock()
	ctx, cancel := b.call(ctx)
	defer cancel()
	res, err := b.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return system.Info{}, b.unavailable("read the engine's info", err)
	}
	b.mu.Lock()
	b.info, b.infoAt = &res.Info, time.Now()
	b.mu.Unlock()
	return res.Info, nil
}

// Image returns the image a plan runs in: its image reference, else the
// berth-agent image built from its agent binary (built once per binary
// content; concurrent runs wait for the same build, no lock is held while
// it runs).
func (b *Backend) Image(ctx context.Context, p isolation.Plan) (string, error) {
	if p.Container.Image != "" {
		return p.Container.Image, nil
	}
	stamp, err := filestamp.Of(p.AgentBinary)
	if err != nil {
		return "", &isolation.RunError{Reason: isolation.ReasonImageUnavailable, Detail: fmt.Sprintf("cannot build the agent image: berth-agent %s is missing; set [scheduler] agent_binary or container_mode.image", p.AgentBinary), Err: err}
	}
	key := agentBinary{path: p.AgentBinary, stamp: stamp}
	b.mu.Lock()
	if tag, ok := b.images[key]; ok {
		b.mu.Unlock()
		return tag, nil
	}
	build, running := b.builds[key]
	if !running {
		build = &imageBuild{done: make(chan struct{})}
		b.builds[key] = build
	}
	b.mu.Unlock()
	if !running {
		go b.build(key, build)
	}
	select {
	case <-build.done:
	case <-ctx.Done():
		return "", &isolation.RunError{Reason: isolation.ReasonCanceled, Detail: "while the berth-agent image was being built", Err: context.Cause(ctx)}
	}
	if build.err != nil {
		return "", &isolation.RunError{Reason: isolation.ReasonImageUnavailable, Detail: "cannot build the berth-agent image; set container_mode.image to an image that exists (docker images) or fix the cause", Err: build.err}
	}
	return build.tag, nil
}

// agentBinary is one version of a berth-agent binary: a rebuilt or
// replaced file (another inode, size, mtime or ctime) gets an image of its
// own.
type agentBinary struct {
	path  string
	stamp filestamp.Stamp
}

// build builds the berth-agent image once for everyone waiting on it.
func (b *Backend) build(key agentBinary, build *imageBuild) {
	ctx, cancel := context.WithTimeout(context.Background(), b.buildTimeout)
	defer cancel()
	build.tag, build.err = imagectl.Ensure(ctx, b.cli, imagectl.AgentImage{AgentBinary: key.path, Busybox: b.busybox})
	b.mu.Lock()
	delete(b.builds, key)
	if build.err == nil {
		b.images[key] = build.tag
	}
	b.mu.Unlock()
	close(build.done)
}

// prepared is everything checked before a container is created.
type prepared struct {
	image  string
	config *container.Config
	host   *container.HostConfig
	hash   string
}

// prepare checks the engine, the image, its architecture and the runtime,
// and builds the container's configuration from the plan.
func (b *Backend) prepare(ctx context.Context, p isolation.Plan) (prepared, error) {
	var out prepared
	if err := checkPlan(p); err != nil {
		return out, err
	}
	if fi, err := os.Stat(p.Workspace); err != nil || !fi.IsDir() || !filepath.IsAbs(p.Workspace) {
		return out, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("workspace %q is not a directory", p.Workspace), Err: err}
	}
	userSpec, err := containerUser(p)
	if err != nil {
		return out, err
	}
	info, err := b.engineInfo(ctx)
	if err != nil {
		return out, err
	}
	c := p.Container
	if c.Runtime != "" {
		if _, ok := info.Runtimes[c.Runtime]; !ok {
			return out, isolation.Errorf(isolation.ReasonStart, "container_mode.runtime %q is not registered with the engine (registered: %s); install it and add it to the engine's runtimes, or pick one of those",
				c.Runtime, strings.Join(sortedKeys(info.Runtimes), ", "))
		}
	}
	if out.image, err = b.Image(ctx, p); err != nil {
		return out, err
	}
	inspectCtx, cancel := b.call(ctx)
	img, err := b.cli.ImageInspect(inspectCtx, out.image)
	cancel()
	if cerrdefs.IsNotFound(err) {
		return out, isolation.Errorf(isolation.ReasonImageUnavailable, "image %q is not in the engine: build or load it (docker build/load; no registry is used), or unset container_mode.image to use the built-in berth-agent image", out.image)
	}
	if err != nil {
		return out, b.unavailable(fmt.Sprintf("inspect image %q", out.image), err)
	}
	if got, want := imagectl.NormalizeArch(img.Architecture), imagectl.NormalizeArch(info.Architecture); got != want {
		return out, isolation.Errorf(isolation.ReasonStart, "image %q is built for %s but the engine runs on %s (it would fail with \"exec format error\"); build the image for %s", out.image, img.Architecture, info.Architecture, want)
	}

	securityOpt := []string{"no-new-privileges"}
	for _, opt := range c.SecurityOpt {
		o, err := engineSecurityOpt(opt)
		if err != nil {
			return out, err
		}
		securityOpt = append(securityOpt, o)
	}
	memory := p.Limits.MemoryBytes // no limit is 0 here: checkPlan refused that
	pids := p.Limits.Pids
	out.config = &container.Config{
		Image:       out.image,
		User:        userSpec,
		Env:         Environment(),
		WorkingDir:  isolation.ContainerWorkspace,
		OpenStdin:   true,
		StdinOnce:   true,
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Labels: map[string]string{
			LabelRun:      p.RunID,
			LabelAttempt:  strconv.Itoa(p.Attempt),
			LabelAgent:    p.AgentID,
			LabelInstance: b.instance,
		},
	}
	out.host = &container.HostConfig{
		Binds:          binds(p),
		NetworkMode:    container.NetworkMode(p.Network.Mode),
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{isolation.ContainerTmp: "rw,nosuid,nodev,size=" + isolation.FormatBytes(p.Limits.TmpfsBytes) + ",mode=1777"},
		CapDrop:        []string{"ALL"},
		SecurityOpt:    securityOpt,
		Runtime:        c.Runtime,
		LogConfig:      container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     memory,
			MemorySwap: memory, // no swap on top of the limit
			PidsLimit:  &pids,
			NanoCPUs:   p.Limits.NanoCPUs,
		},
	}
	out.hash = configHash(img.ID, out.config, out.host)
	out.config.Labels[LabelConfigHash] = out.hash
	return out, nil
}

// binds are the plan's mounts as the engine takes them; a plan without
// mounts gets its workspace at /workspace.
func binds(p isolation.Plan) []string {
	mounts := p.Mounts
	if len(mounts) == 0 {
		mounts = []isolation.Mount{{Source: p.Workspace, Target: isolation.ContainerWorkspace}}
	}
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, m.Source+":"+m.Target+":"+mode)
	}
	return out
}

// Environment is the complete environment of a container agent. It holds no
// secret: the provider key travels on stdin only.
func Environment() []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + isolation.ContainerWorkspace,
		"TMPDIR=" + isolation.ContainerTmp,
		"LANG=C.UTF-8",
	}
}

// Run creates a fresh container for spec (or takes a warm one), and lets
// isolation.Supervise hand it the request, wait for the response, kill and
// drain it; the container is removed whatever happened.
func (b *Backend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	return isolation.Supervise(ctx, spec, b.start)
}

// start is the StartFunc of container runs.
func (b *Backend) start(ctx context.Context, spec isolation.Spec, input []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
	began := time.Now()
	p, err := b.prepare(ctx, spec.Plan)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}
	steps := []any{"run_id", spec.RunID, "agent", spec.AgentID, "prepare_ms", sinceMS(began)}
	var s *session
	// A run with an egress socket needs its own mount of the run's socket
	// directory, which no waiting container has.
	if spec.Container.Warm > 0 && spec.Egress == nil {
		s = b.takeWarm(spec, p.hash)
	}
	if s == nil {
		created := time.Now()
		createCtx, cancel := b.call(context.WithoutCancel(ctx))
		c, err := b.cli.ContainerCreate(createCtx, client.ContainerCreateOptions{Config: p.config, HostConfig: p.host, Name: containerName(isolation.AttemptName(spec.RunID, spec.Attempt))})
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, b.unavailable("create the container", err)
			}
			return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot create container", Err: err}
		}
		steps = append(steps, "create_ms", sinceMS(created))
		if s, err = b.begin(ctx, c.ID); err != nil {
			b.release(c.ID)
			return nil, err
		}
		steps = append(steps, s.steps...)
	} else {
		steps = append(steps, "warm", true)
	}
	s.b, s.runID = b, spec.RunID
	s.output(stdout, stderr)
	go func() {
		_, _ = s.attach.Conn.Write(input)
		_ = s.attach.CloseWrite()
	}()
	b.log.Debug("container has its request", append(steps, "total_ms", sinceMS(began))...)
	if b.removeInBackground {
		return endingLater{s}, nil
	}
	return s, nil
}

// sinceMS is the milliseconds since t, for the timing lines at debug level.
func sinceMS(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// session is a started container whose stdin is still open: attached and
// waited for before it started, so none of its output is lost. Its output
// goes to a buffer until a run takes it (output), so a warm container's
// early stderr is kept.
type session struct {
	b        *Backend
	id       string
	runID    string // the run it serves; "" while it waits in a pool
	hash     string // the config hash it was made with (warm members)
	attach   client.ContainerAttachResult
	wait     client.ContainerWaitResult
	stopWait context.CancelFunc
	out      *switchWriter
	errOut   *switchWriter
	copied   chan struct{}
	released sync.Once
	steps    []any // attach_ms, start_ms: how long begin's engine calls took
}

func (s *session) close() {
	s.attach.Close()
	s.stopWait()
}

// output sends the container's stdout and stderr to the run's writers.
func (s *session) output(stdout, stderr io.Writer) {
	s.out.set(stdout)
	s.errOut.set(stderr)
}

// exited reports whether the container of a session ended already.
func (s *session) exited() bool {
	select {
	case <-s.copied:
		return true
	case <-s.wait.Error:
		return true
	default:
		return false
	}
}

func (s *session) Handle() string { return handlePrefix + s.id }

func (s *session) Wait(ctx context.Context) (isolation.Exit, error) {
	select {
	case r := <-s.wait.Result:
		return isolation.Exit{Code: int(r.StatusCode)}, nil
	case err := <-s.wait.Error:
		return isolation.Exit{Code: -1}, &isolation.RunError{Reason: isolation.ReasonEngineUnavailable, Detail: "lost the container while waiting for it", Err: err}
	case <-ctx.Done():
		return isolation.Exit{Code: -1}, &isolation.RunError{Reason: isolation.ReasonEngineUnavailable, Detail: "the container did not end", Err: context.Cause(ctx)}
	}
}

// Kill stops the container now; it is removed on Release.
func (s *session) Kill(ctx context.Context) error {
	ctx, cancel := s.b.call(ctx)
	defer cancel()
	if _, err := s.b.cli.ContainerKill(ctx, s.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		return fmt.Errorf("cannot kill container %s: %w", s.id, err)
	}
	return nil
}

func (s *session) Drained() <-chan struct{} { return s.copied }

// oomEventWait bounds how long a run in which something died of SIGKILL
// waits for the engine to report an OOM kill.
const oomEventWait = 5 * time.Second

// Inspect asks the engine whether the kernel OOM-killed a process of the
// container. The engine learns of an OOM kill asynchronously: under load it
// may hear of it after the container's exit (seen 25-113 ms late), and then
// Docker 20.10 never sets State.OOMKilled (it takes it from the exit event)
// but still sends the container's "oom" event. So when something in the run
// died of SIGKILL, the container's oom events since it started are awaited
// for up to oomEventWait before the answer counts as no.
func (s *session) Inspect(ctx context.Context, suspect bool) bool {
	callCtx, cancel := s.b.call(ctx)
	st, err := s.b.cli.ContainerInspect(callCtx, s.id, client.ContainerInspectOptions{})
	cancel()
	started := ""
	if err == nil && st.Container.State != nil {
		if st.Container.State.OOMKilled {
			return true
		}
		started = st.Container.State.StartedAt
	}
	return suspect && s.oomEventSince(ctx, started)
}

// oomEventSince waits for an oom event of the container since started (an
// RFC 3339 time; "" is from now on).
func (s *session) oomEventSince(ctx context.Context, started string) bool {
	ctx, cancel := context.WithTimeout(ctx, oomEventWait)
	defer cancel()
	stream := s.b.cli.Events(ctx, client.EventsListOptions{Since: started,
		Filters: make(client.Filters).Add("type", "container").Add("container", s.id).Add("event", string(events.ActionOOM))})
	for {
		select {
		case m := <-stream.Messages:
			if m.Action == events.ActionOOM {
				return true
			}
		case <-stream.Err:
			return false
		}
	}
}

// Release closes the streams and removes the container (in the
// background with Options.RemoveInBackground).
func (s *session) Release() {
	s.released.Do(func() {
		s.close()
		if s.b.removeInBackground {
			s.b.own(s.id)
			s.b.removals.Go(func() { s.b.release(s.id) })
			return
		}
		s.b.release(s.id)
	})
}

// endingLater is a session of a backend with Options.RemoveInBackground:
// its run may be answered as soon as the agent's response and log are
// complete, and the container is then killed, waited for, checked for an
// OOM kill and removed after Run returned.
type endingLater struct{ *session }

var _ isolation.BackgroundEnder = endingLater{}

// EndsInBackground runs what is left of an answered run where Drain waits
// for it; a crash before it is done leaves the container to Sweep.
func (s endingLater) EndsInBackground(teardown func() error) {
	s.b.own(s.id) // its run is over: Sweep must not take it for an orphan
	s.b.removals.Go(func() {
		began := time.Now()
		if err := teardown(); err != nil {
			s.b.log.Warn("the container of an answered run did not end cleanly", "run_id", s.runID, "container", s.id, "err", err)
			return
		}
		s.b.log.Debug("container of an answered run ended", "run_id", s.runID, "container", s.id, "teardown_ms", sinceMS(began))
	})
}

// switchWriter buffers what is written until set hands it a writer.
type switchWriter struct {
	mu  sync.Mutex
	buf []byte
	w   io.Writer
}

func (w *switchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w != nil {
		return w.w.Write(p)
	}
	if room := StderrTail - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (w *switchWriter) set(to io.Writer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		_, _ = to.Write(w.buf)
		w.buf = nil
	}
	w.w = to
}

// begin attaches to a created container, starts it and returns with the
// agent blocked on its stdin.
func (b *Backend) begin(ctx context.Context, id string) (*session, error) {
	attached := time.Now()
	attachCtx, cancel := b.call(ctx)
	attach, err := b.cli.ContainerAttach(attachCtx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, b.unavailable("attach to the container", err)
		}
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot attach to container", Err: err}
	}
	// The wait lasts as long as the container; Supervise bounds it (the
	// run's timeout, then a kill) and Release ends it.
	waitCtx, stopWait := context.WithCancel(context.Background())
	s := &session{
		b:        b,
		id:       id,
		attach:   attach,
		wait:     b.cli.ContainerWait(waitCtx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit}),
		stopWait: stopWait,
		out:      &switchWriter{},
		errOut:   &switchWriter{},
		copied:   make(chan struct{}),
	}
	go func() {
		defer close(s.copied)
		_, _ = stdcopy.StdCopy(s.out, s.errOut, attach.Reader)
	}()
	s.steps = []any{"attach_ms", sinceMS(attached)}
	started := time.Now()
	startCtx, cancel := b.call(ctx)
	_, err = b.cli.ContainerStart(startCtx, id, client.ContainerStartOptions{})
	cancel()
	if err != nil {
		s.close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, b.unavailable("start the container", err)
		}
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start container", Err: err}
	}
	s.steps = append(s.steps, "start_ms", sinceMS(started))
	return s, nil
}

// remove deletes a container and its anonymous volumes, running or not.
func (b *Backend) remove(id string) {
	began := time.Now()
	ctx, cancel := b.call(context.Background())
	defer cancel()
	if err := removeContainer(ctx, b.cli, id); err != nil {
		b.log.Error("cannot remove container; the next scheduler start removes it", "container", id, "err", err)
		return
	}
	b.log.Debug("container removed", "container", id, "remove_ms", sinceMS(began), "background", b.removeInBackground)
}

func removeContainer(ctx context.Context, cli *client.Client, id string) error {
	_, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	// A removal already in progress is someone else finishing the job.
	if cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress") {
		return nil
	}
	return err
}

// Kill removes the container named by a handle OnStart reported. A container
// that is gone is not an error.
func (b *Backend) Kill(ctx context.Context, handle string) error {
	id, ok := strings.CutPrefix(handle, handlePrefix)
	if !ok || id == "" {
		return fmt.Errorf("cannot parse handle %q: want %s<id>", handle, handlePrefix)
	}
	ctx, cancel := b.call(ctx)
	defer cancel()
	if err := removeContainer(ctx, b.cli, id); err != nil {
		return fmt.Errorf("cannot remove container %s: %w", id, err)
	}
	return nil
}

// Sweep removes this instance's containers whose run and attempt live does
// not claim (nil claims none): what a crashed scheduler left behind, also
// when the run is running again in another attempt. A container without a
// berth.attempt label is of attempt 0, which no start has. It returns the
// runs it cleaned up.
func (b *Backend) Sweep(ctx context.Context, live func(runID string, attempt int) bool) ([]string, error) {
	listCtx, cancel := b.call(ctx)
	list, err := b.cli.ContainerList(listCtx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelInstance+"="+b.instance),
	})
	cancel()
	if err != nil {
		if b.engineAbsent() {
			// No engine was ever started here (a fresh install without
			// Docker): no container of ours can exist, so nothing is left
			// behind.
			return nil, nil
		}
		return nil, fmt.Errorf("cannot list containers: %w", err)
	}
	var removed []string
	var errs []error
	for _, c := range list.Items {
		if b.owns(c.ID) {
			continue
		}
		run, isRun := c.Labels[LabelRun]
		if !isRun {
			// A warm pool member (berth.pool) of an earlier process: it never
			// saw a request, so there is no run to report.
			if err := b.Kill(ctx, handlePrefix+c.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			b.log.Info("removed a warm container left behind by an earlier scheduler", "container", c.ID, "agent", c.Labels[LabelPool])
			continue
		}
		attempt, _ := strconv.Atoi(c.Labels[LabelAttempt])
		if live != nil && live(run, attempt) {
			continue
		}
		if err := b.Kill(ctx, handlePrefix+c.ID); err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", run, err))
			continue
		}
		removed = append(removed, run)
	}
	return removed, errors.Join(errs...)
}

// engineAbsent says the engine's unix socket does not exist: no engine
// runs (or has run since boot) at that address. A socket that exists but
// does not answer is an engine that is down, not absent.
func (b *Backend) engineAbsent() bool {
	path, ok := strings.CutPrefix(b.cli.DaemonHost(), "unix://")
	if !ok {
		return false
	}
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// engineSecurityOpt turns a checked security_opt entry into what the API
// expects: a seccomp profile's JSON instead of its path.
func engineSecurityOpt(opt string) (string, error) {
	key, value, ok := strings.Cut(opt, "=")
	if !ok {
		key, value, _ = strings.Cut(opt, ":")
	}
	if key != "seccomp" {
		return key + "=" + value, nil
	}
	data, err := os.ReadFile(value)
	if err != nil {
		return "", &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot read seccomp profile", Err: err}
	}
	return "seccomp=" + string(data), nil
}

// containerUser is "uid:gid" of the plan's run user, never root.
func containerUser(p isolation.Plan) (string, error) {
	u := p.User
	if u == nil {
		if p.RunAs == "" {
			return "", isolation.Errorf(isolation.ReasonStart, "no run_as user: container agents never run as root")
		}
		var err error
		if u, err = isolation.LookupRunUser(p.RunAs); err != nil {
			return "", &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot find run_as user %q", p.RunAs), Err: err}
		}
	}
	if u.UID == 0 {
		return "", isolation.Errorf(isolation.ReasonStart, "run_as user %q is root; container agents run only as an unprivileged user", u.Name)
	}
	return fmt.Sprintf("%d:%d", u.UID, u.GID), nil
}

// configHash identifies what a container was made from (not the request):
// the image and every setting. A warm container whose hash differs from the
// agent's current one is stale.
func configHash(imageID string, cfg *container.Config, host *container.HostConfig) string {
	c := *cfg
	c.Labels = nil
	data, _ := json.Marshal(struct {
		Image  string
		Config container.Config
		Host   *container.HostConfig
	}{imageID, c, host})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func containerName(runID string) string {
	var r [3]byte
	_, _ = rand.Read(r[:])
	return "berth-" + runID + "-" + hex.EncodeToString(r[:])
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// Explain says how a plan's container is confined, for `berthctl sandbox
// explain`.
func (b *Backend) Explain(p isolation.Plan) isolation.Confinement {
	l := p.Limits
	c := isolation.Confinement{Mode: "container"}
	// A limit the plan lacks is named, not shown with a default: checkPlan
	// refuses such a plan.
	limit := func(set bool, holds, missing string) {
		if set {
			c.Holds = append(c.Holds, holds)
		} else {
			c.Missing = append(c.Missing, missing+", so its runs are refused")
		}
	}
	limit(l.MemoryBytes > 0, fmt.Sprintf("Memory=%s with MemorySwap=%s (no swap on top; an OOM kill fails the run with %q)", isolation.FormatBytes(l.MemoryBytes), isolation.FormatBytes(l.MemoryBytes), isolation.ReasonOutOfMemory),
		"Memory: the plan has no memory limit")
	limit(l.Pids > 0, fmt.Sprintf("PidsLimit=%d", l.Pids), "PidsLimit: the plan has no process limit")
	limit(l.NanoCPUs > 0, fmt.Sprintf("NanoCPUs=%d", l.NanoCPUs), "NanoCPUs: the plan has no CPU limit")
	limit(l.TmpfsBytes > 0, fmt.Sprintf("read-only rootfs; tmpfs %s of %s", isolation.ContainerTmp, isolation.FormatBytes(l.TmpfsBytes)),
		fmt.Sprintf("tmpfs %s: the plan gives it no size", isolation.ContainerTmp))
	c.Holds = append(c.Holds,
		"CapDrop=ALL, no-new-privileges, a non-root user",
		"no published ports, no engine socket; the container is removed after the run",
		fmt.Sprintf("every engine call has a deadline of %s (an engine that does not answer fails the run with %q)", b.engineTimeout, isolation.ReasonEngineUnavailable))
	if p.Network.Mode == "none" {
		c.Holds = append(c.Holds, "NetworkMode=none")
		if p.Egress != nil {
			c.Holds = append(c.Holds, "egress only through the run's socket, bind-mounted at "+isolation.SandboxEgressDir+"; no provider key in the container")
		}
	} else {
		c.Missing = append(c.Missing, fmt.Sprintf("network isolation: NetworkMode=%s reaches out through the engine's bridge (container_mode.network)", p.Network.Mode))
	}
	if p.Container.Runtime == "" {
		c.Missing = append(c.Missing, "a sandboxing runtime: the container shares the host's kernel (container_mode.runtime unset)")
	} else {
		c.Holds = append(c.Holds, "runtime "+p.Container.Runtime)
	}
	return c
}
