package images

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/godbus/dbus/v5"
	"github.com/jonboulle/clockwork"
	"github.com/moby/moby/client"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/internal/version"
)

// DefaultTarget names the global [image_config] as a build target.
const DefaultTarget = "default"

// Errors the D-Bus object maps to dev.berth.Error names.
var (
	ErrNotFound        = errors.New("not found")
	ErrInvalidArgument = errors.New("invalid argument")
	ErrUnavailable     = errors.New("unavailable")
	ErrInUse           = errors.New("in use")
)

// Fetcher downloads the .debs a base lacks for packages into dir.
type Fetcher interface {
	Fetch(ctx context.Context, status []byte, packages []string, dir string, onLine func(string)) ([]string, error)
}

// Options are the service's seams; zero values are the real ones.
type Options struct {
	// Engine is the Docker engine (default: the one DOCKER_HOST names).
	Engine *client.Client
	Logger *slog.Logger
	Clock  clockwork.Clock
	// Version is berth's version, the isolation tags' first part (default:
	// the one the build stamped, internal/version).
	Version string
	// Fetcher gets packages (default: the host's apt when it has one, else
	// the build container fetches them itself).
	Fetcher Fetcher
	// BuildTimeout bounds one whole build (default 30 minutes).
	BuildTimeout time.Duration
	// Authorizer decides who may build, remove and clean.
	Authorizer bus.Authorizer
	// Busybox is the static busybox of the default agent image.
	Busybox string
}

// Service is berth-imaged's logic: it resolves targets into images, builds
// them (one build per image however many ask), and keeps images.db.
type Service struct {
	cfg     atomic.Pointer[config.Config]
	store   *store
	engine  *client.Client
	ownsCli bool
	log     *slog.Logger
	clock   clockwork.Clock
	version string
	fetcher Fetcher
	source  imagectl.PackageSource
	timeout time.Duration
	auth    bus.Authorizer
	busybox string
	tmpDir  string

	plans planMemo // computed plans (planmemo.go)

	mu     sync.Mutex // guards builds and jobs; never held across I/O
	builds map[string]*build
	jobs   map[uint64]*Job

	inFlight atomic.Int32 // method calls being served, for idleness
	events   chan struct{}
	conn     atomic.Pointer[dbus.Conn]
	props    atomic.Pointer[properties]

	// buildsStarted counts builds begun (tests: N callers → one build).
	buildsStarted atomic.Int64

	metrics *imagesMetrics // metrics.go
}

// New opens images.db in stateDir and returns the service.
func New(cfg *config.Config, stateDir string, opts Options) (*Service, error) {
	if err := config.CheckImageEnv(cfg, os.Getenv); err != nil {
		return nil, fmt.Errorf("cannot serve images: %w", err)
	}
	st, err := openStore(filepath.Join(stateDir, "images.db"))
	if err != nil {
		return nil, err
	}
	s := &Service{
		store:   st,
		engine:  opts.Engine,
		log:     opts.Logger,
		clock:   opts.Clock,
		version: opts.Version,
		fetcher: opts.Fetcher,
		timeout: opts.BuildTimeout,
		auth:    opts.Authorizer,
		busybox: opts.Busybox,
		tmpDir:  filepath.Join(stateDir, "tmp"),
		builds:  map[string]*build{},
		jobs:    map[uint64]*Job{},
		events:  make(chan struct{}, 1),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	if s.version == "" {
		s.version = version.String()
	}
	if s.timeout <= 0 {
		s.timeout = 30 * time.Minute
	}
	s.metrics = newImagesMetrics(s)
	if s.fetcher == nil {
		if imagectl.HostHasApt() {
			s.fetcher = imagectl.AptFetcher{}
		} else {
			s.source = imagectl.BuildNetwork
		}
	}
	if s.engine == nil {
		cli, err := imagectl.NewEngineClient()
		if err != nil {
			st.close()
			return nil, fmt.Errorf("cannot create a Docker engine client: %w", err)
		}
		s.engine, s.ownsCli = cli, true
	}
	s.cfg.Store(cfg)
	if n, err := st.interruptLeftovers(s.clock.Now()); err != nil {
		s.log.Error(err.Error())
	} else if n > 0 {
		s.log.Warn("builds a previous berth-imaged left unfinished are marked failed", "count", n)
	}
	_ = os.RemoveAll(s.tmpDir)
	return s, nil
}

// Reload swaps the configuration; running builds keep what they started with.
func (s *Service) Reload(cfg *config.Config) {
	if err := config.CheckImageEnv(cfg, os.Getenv); err != nil {
		s.log.Error("config refused: "+err.Error(), "err", err)
		return
	}
	s.cfg.Store(cfg)
}

// Run waits until ctx ends, then cancels running builds.
func (s *Service) Run(ctx context.Context) error {
	<-ctx.Done()
	s.mu.Lock()
	for _, b := range s.builds {
		b.cancel()
	}
	s.mu.Unlock()
	return nil
}

// Close waits for no build and closes images.db and the engine client.
func (s *Service) Close() error {
	err := s.store.close()
	if s.ownsCli {
		s.engine.Close()
	}
	return err
}

// Busy tells whether a build runs or a call is being served: the daemon
// does not exit for idleness then.
func (s *Service) Busy() bool {
	if s.inFlight.Load() > 0 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.builds) > 0
}

// BuildsStarted is how many builds this service began.
func (s *Service) BuildsStarted() int64 { return s.buildsStarted.Load() }

func (s *Service) engineCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, imagectl.EngineTimeout)
}

// imageSettings resolves a target: an agent's effective image_config, or
// the global [image_config] for DefaultTarget.
func (s *Service) imageSettings(target string) (config.ImageConfig, error) {
	cfg := s.cfg.Load()
	if target == "" || target == DefaultTarget {
		return cfg.DefaultImage(), nil
	}
	a, err := cfg.Agent(target)
	if err != nil {
		return config.ImageConfig{}, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	return a.Image, nil
}

func (s *Service) agentBinary() string {
	if p := s.cfg.Load().Scheduler.AgentBinary; p != "" {
		return p
	}
	return imagectl.AgentBinaryPath
}

// plan is what a target's images are made of, with the engine's facts
// resolved; computing it builds nothing.
type plan struct {
	target   string
	settings config.ImageConfig
	// sandbox is set when image_config asks for a container image build.
	sandbox *imagectl.SandboxImage
	// agentImage is set when the isolation image layers on the default
	// scratch+busybox agent image.
	agentImage *imagectl.AgentImage
	agentHash  string
	isolated   imagectl.IsolatedImage
	hash       string // the isolation image's
	tag        string // the isolation image's
}

func (p *plan) sandboxTag() string {
	if p.sandbox == nil {
		return ""
	}
	return p.sandbox.Tag()
}

// planFor resolves target's images. It inspects the base image (whose ID
// the hash covers) and reads berth-agent, but builds nothing.
func (s *Service) planFor(ctx context.Context, target string) (*plan, error) {
	if target == "" {
		target = DefaultTarget
	}
	settings, err := s.imageSettings(target)
	if err != nil {
		return nil, err
	}
	agent := s.agentBinary()
	// The base image's ID is asked of the engine every time: a re-pulled
	// base makes another plan.
	var baseID string
	if settings.Enabled {
		base := settings.BaseImage
		if settings.Image != "" {
			base = settings.Image
		}
		if baseID, err = s.baseImageID(ctx, base); err != nil {
			return nil, err
		}
	}
	key, memoizable := s.plans.key(target, settings, baseID, s.version, agent, s.busybox)
	if memoizable {
		if p, ok := s.plans.get(key); ok {
			return p, nil
		}
	}
	p := &plan{target: target, settings: settings}
	switch {
	case settings.Enabled && settings.Image != "":
		p.isolated = imagectl.IsolatedImage{From: baseID, BaseRef: settings.Image, BaseHash: baseID}
	case settings.Enabled:
		p.sandbox = &imagectl.SandboxImage{BaseRef: settings.BaseImage, BaseID: baseID, Packages: settings.Packages, Env: settings.EnvVars, Source: s.source}
		p.isolated = imagectl.IsolatedImage{From: p.sandbox.Tag(), BaseRef: p.sandbox.Tag() + " (image_config on " + settings.BaseImage + ")", BaseHash: p.sandbox.Hash()}
	default:
		a := imagectl.AgentImage{AgentBinary: agent, Busybox: s.busybox}
		hash, err := a.Context(io.Discard)
		if err != nil {
			return nil, fmt.Errorf("cannot prepare the default agent image: %w", err)
		}
		p.agentImage, p.agentHash = &a, hash
		p.isolated = imagectl.IsolatedImage{From: imagectl.Tag(hash), BaseRef: imagectl.Tag(hash) + " (default: scratch and busybox)", BaseHash: hash}
	}
	p.isolated.AgentBinary, p.isolated.Version = agent, s.version
	if p.hash, err = p.isolated.Hash(); err != nil {
		return nil, err
	}
	p.tag = imagectl.IsolatedTag(s.version, p.hash)
	if memoizable {
		s.plans.put(key, p)
	}
	return p, nil
}

// baseImageID inspects a base image, pulling it when it is missing. A base
// that is neither here nor pullable is an error that says how to build it.
func (s *Service) baseImageID(ctx context.Context, ref string) (string, error) {
	ictx, cancel := s.engineCtx(ctx)
	img, err := s.engine.ImageInspect(ictx, ref)
	cancel()
	if err == nil {
		return img.ID, nil
	}
	if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("%w: cannot inspect base image %s: %v", ErrUnavailable, ref, err)
	}
	hint := "build it offline with scripts/base-image.sh (it makes " + config.DefaultBaseImage + "), or set image_config.base_image to an image the engine has"
	if ref == config.DefaultBaseImage {
		return "", fmt.Errorf("%w: base image %s is missing: %s", ErrNotFound, ref, hint)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := s.engine.ImagePull(pctx, ref, client.ImagePullOptions{})
	if err == nil {
		err = res.Wait(pctx)
		res.Close()
	}
	if err != nil {
		return "", fmt.Errorf("%w: base image %s is missing and cannot be pulled (%v): %s", ErrNotFound, ref, err, hint)
	}
	ictx, cancel2 := s.engineCtx(ctx)
	defer cancel2()
	img, err = s.engine.ImageInspect(ictx, ref)
	if err != nil {
		return "", fmt.Errorf("%w: base image %s is missing after its pull: %v", ErrNotFound, ref, err)
	}
	return img.ID, nil
}

// Dockerfile previews the Dockerfiles of target's images.
func (s *Service) Dockerfile(ctx context.Context, target string) (string, error) {
	p, err := s.planFor(ctx, target)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	switch {
	case p.sandbox != nil:
		fmt.Fprintf(&b, "# ---- container image %s\n%s\n", p.sandbox.Tag(), p.sandbox.Dockerfile())
	case p.agentImage != nil:
		fmt.Fprintf(&b, "# ---- default agent image %s\n%s\n", imagectl.Tag(p.agentHash), p.agentImage.Dockerfile())
	}
	fmt.Fprintf(&b, "# ---- isolation image %s\n%s", p.tag, p.isolated.Dockerfile())
	return b.String(), nil
}

// EnsureIsolationImage returns the isolation image's tag for agent,
// building it first when the engine lacks it (sharing a build already
// running for it), within ctx.
//
// The call is a span (images.ensure) under ctx's, and the build it starts
// hangs under that.
func (s *Service) EnsureIsolationImage(ctx context.Context, agent string) (_ string, err error) {
	ctx, span := tracing.Tracer().Start(ctx, spanEnsure, trace.WithAttributes(attribute.String("berth.agent", agent)))
	defer func() { endSpan(span, err) }()
	if agent == "" || agent == DefaultTarget {
		return "", fmt.Errorf("%w: EnsureIsolationImage needs an agent id", ErrInvalidArgument)
	}
	p, err := s.resolve(ctx, agent)
	if err != nil {
		return "", err
	}
	span.SetAttributes(imageAttrs(p)...)
	ictx, cancel := s.engineCtx(ctx)
	_, err = s.engine.ImageInspect(ictx, p.tag)
	cancel()
	switch {
	case err == nil:
		span.SetAttributes(attribute.String("berth.image.outcome", outcomePresent))
		s.used(ctx, p)
		return p.tag, nil
	case !cerrdefs.IsNotFound(err):
		return "", fmt.Errorf("%w: cannot inspect image %s: %v", ErrUnavailable, p.tag, err)
	}
	b := s.joinBuild(ctx, span, p, false)
	select {
	case <-b.done:
	case <-ctx.Done():
		return "", fmt.Errorf("%w: image %s is still building: %v", ErrUnavailable, p.tag, ctx.Err())
	}
	if b.err != nil {
		return "", b.err
	}
	s.used(ctx, p)
	return p.tag, nil
}

// EnsureIsolationImageWith is EnsureIsolationImage under the caller's span
// when opts carry its traceparent (dev.berth.Images1's method of the name).
func (s *Service) EnsureIsolationImageWith(ctx context.Context, agent string, opts busapi.EnsureOptions) (string, error) {
	return s.EnsureIsolationImage(callerTrace(ctx, opts.Traceparent), agent)
}

// resolve is planFor as a span of its own (images.resolve): the target's
// settings, its base image's ID and the images' hashes.
func (s *Service) resolve(ctx context.Context, target string) (p *plan, err error) {
	err = stage(ctx, spanResolve, func(ctx context.Context) error {
		p, err = s.planFor(ctx, target)
		return err
	}, attribute.String("berth.image.target", target))
	return p, err
}

// used records that p's isolation image was handed out. An image the
// engine has but images.db does not (built before images.db was wiped, or
// by another berth-imaged) is adopted: recorded with the engine's facts, so
// that ListImages shows it and Clean can remove it.
func (s *Service) used(ctx context.Context, p *plan) {
	now := s.clock.Now().UTC()
	// A use recorded less than usedEvery ago is not written again: a write
	// per run was an fsynced commit per container run, for a time that
	// orders images for Clean and shows in ListImages.
	if rec, ok, err := s.store.image(p.tag); err == nil && ok && !rec.LastUsed.IsZero() && now.Sub(rec.LastUsed) < usedEvery && !now.Before(rec.LastUsed) {
		return
	}
	tags := map[string]string{p.tag: imagectl.KindIsolated}
	if p.sandbox != nil {
		tags[p.sandbox.Tag()] = imagectl.KindSandbox
	}
	if p.agentImage != nil {
		tags[imagectl.Tag(p.agentHash)] = KindAgent
	}
	for tag, kind := range tags {
		err := s.store.updateImage(tag, func(r *Record) {
			if tag == p.tag {
				r.LastUsed = now
			}
		})
		if !errors.Is(err, errNoRecord) {
			if err != nil {
				s.log.Warn("cannot record an image's use", "image", tag, "err", err)
			}
			continue
		}
		ictx, cancel := s.engineCtx(ctx)
		img, ierr := s.engine.ImageInspect(ictx, tag)
		cancel()
		if ierr != nil {
			continue
		}
		var hash string
		if img.Config != nil {
			hash = img.Config.Labels[imagectl.LabelHash]
		}
		rec := Record{Tag: tag, Kind: kind, Hash: hash, ID: img.ID, Size: img.Size, Status: StatusReady,
			Inputs: map[string]string{"adopted": "present in the engine before this images.db recorded it"}}
		if t, err := time.Parse(time.RFC3339Nano, img.Created); err == nil {
			rec.Created = t.UTC()
		}
		if tag == p.tag {
			rec.LastUsed = now
		}
		if err := s.store.putImage(rec); err != nil {
			s.log.Warn("cannot record an image", "image", tag, "err", err)
		}
	}
	s.changed()
}

func (s *Service) touch(tag string) {
	now := s.clock.Now().UTC()
	if err := s.store.updateImage(tag, func(r *Record) { r.LastUsed = now }); err != nil && !errors.Is(err, errNoRecord) {
		s.log.Warn("cannot record an image's use", "err", err)
	}
}

// build is one image build however many callers and jobs wait for it.
type build struct {
	tag    string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done closes
	// span is the build's (images.build); a call that joins the build
	// links to it.
	span trace.SpanContext

	mu          sync.Mutex
	step, total uint32
	watchers    []func(step, total uint32, line string)
}

func (b *build) watch(f func(step, total uint32, line string)) {
	b.mu.Lock()
	b.watchers = append(b.watchers, f)
	b.mu.Unlock()
}

func (b *build) progress(step, total uint32, line string) {
	b.mu.Lock()
	if step > 0 {
		b.step = step
	}
	if total > 0 {
		b.total = total
	}
	st, tot := b.step, b.total
	ws := slices.Clone(b.watchers)
	b.mu.Unlock()
	for _, w := range ws {
		w(st, tot, line)
	}
}

// joinBuild is startBuild for the call whose span is span: the call's
// outcome is built when it started the build, else shared, with a link to
// the build it waits for.
func (s *Service) joinBuild(ctx context.Context, span trace.Span, p *plan, noCache bool) *build {
	b, started := s.startBuild(ctx, p, noCache)
	if started {
		span.SetAttributes(attribute.String("berth.image.outcome", outcomeBuilt))
		return b
	}
	span.SetAttributes(attribute.String("berth.image.outcome", outcomeShared))
	span.AddLink(trace.Link{SpanContext: b.span})
	return b
}

// startBuild returns the running build of p's image, or starts one (then
// started is true) as a span under ctx's. The build outlives ctx: it is
// bounded by the build timeout, not by the call that began it.
func (s *Service) startBuild(ctx context.Context, p *plan, noCache bool) (_ *build, started bool) {
	s.mu.Lock()
	if b, ok := s.builds[p.tag]; ok {
		s.mu.Unlock()
		return b, false
	}
	spanCtx, span := tracing.Tracer().Start(context.WithoutCancel(ctx), spanBuild,
		trace.WithAttributes(append(imageAttrs(p), attribute.Bool("berth.image.no_cache", noCache))...))
	buildCtx, cancel := context.WithTimeout(spanCtx, s.timeout)
	b := &build{tag: p.tag, cancel: cancel, done: make(chan struct{}), span: span.SpanContext()}
	s.builds[p.tag] = b
	s.mu.Unlock()
	s.buildsStarted.Add(1)
	s.changed()

	go func() {
		defer cancel()
		began := s.clock.Now()
		b.err = s.runBuild(buildCtx, p, noCache, b)
		if b.err != nil && buildCtx.Err() != nil && errors.Is(buildCtx.Err(), context.Canceled) {
			b.err = fmt.Errorf("build of %s canceled", p.tag)
		}
		s.countBuild(p.target, b.err, s.clock.Since(began))
		endSpan(span, b.err)
		s.mu.Lock()
		delete(s.builds, p.tag)
		s.mu.Unlock()
		close(b.done)
		s.changed()
	}()
	return b, true
}

// runBuild builds p's base (when berth makes it) and then its isolation
// image, recording both in images.db.
func (s *Service) runBuild(ctx context.Context, p *plan, noCache bool, b *build) error {
	log := s.log.With("image", p.tag)
	if p.target != DefaultTarget {
		log = log.With("agent", p.target)
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		log = log.With("trace_id", sc.TraceID().String())
	}
	log.Info("building image")
	started := s.clock.Now()
	if err := stage(ctx, spanCheckArch, func(ctx context.Context) error { return s.checkArch(ctx, p) }); err != nil {
		return err
	}
	var total, offset uint32
	if p.sandbox != nil {
		total += buildSteps(p.sandbox.Dockerfile())
		if len(p.sandbox.Packages) > 0 && p.sandbox.Source == imagectl.HostDebs {
			total++ // fetching the packages on the host
		}
	}
	total += buildSteps(p.isolated.Dockerfile())
	b.progress(0, total, "building "+p.tag)

	switch {
	case p.sandbox != nil:
		err := stage(ctx, spanSandbox, func(ctx context.Context) (err error) {
			offset, err = s.buildSandbox(ctx, p, noCache, b, total)
			return err
		}, attribute.String("berth.image.tag", p.sandbox.Tag()))
		if err != nil {
			return err
		}
	case p.agentImage != nil:
		err := stage(ctx, spanAgent, func(ctx context.Context) error { return s.ensureAgentImage(ctx, p) },
			attribute.String("berth.image.tag", imagectl.Tag(p.agentHash)))
		if err != nil {
			return err
		}
	}
	err := stage(ctx, spanIsolation, func(ctx context.Context) error { return s.buildIsolation(ctx, p, noCache, b, offset, total) },
		attribute.String("berth.image.tag", p.tag))
	if err != nil {
		return err
	}
	log.Info("image built", "seconds", int(s.clock.Since(started).Seconds()))
	return nil
}

// buildIsolation builds p's isolation image on its base, which is there
// by now, and records it.
func (s *Service) buildIsolation(ctx context.Context, p *plan, noCache bool, b *build, offset, total uint32) error {
	rec := Record{Tag: p.tag, Kind: imagectl.KindIsolated, Hash: p.hash, Status: StatusBuilding,
		Inputs: map[string]string{"base": p.isolated.BaseRef, "version": s.version, "agent_binary": p.isolated.AgentBinary,
			"template": fmt.Sprint(imagectl.IsolatedTemplate)}}
	if err := s.store.putImage(rec); err != nil {
		return err
	}
	tail, id, err := s.stream(ctx, p.tag, func(w io.Writer) error { return p.isolated.WriteContext(w) },
		map[string]string{imagectl.LabelKind: imagectl.KindIsolated, imagectl.LabelHash: p.hash}, noCache, "none", b, offset, total)
	if err := s.finishRecord(ctx, p.tag, id, tail, err); err != nil {
		return err
	}
	return err
}

// checkArch refuses a build that would make an image the engine cannot run:
// a berth-agent or a base built for another architecture.
func (s *Service) checkArch(ctx context.Context, p *plan) error {
	vctx, cancel := s.engineCtx(ctx)
	v, err := s.engine.ServerVersion(vctx, client.ServerVersionOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("%w: cannot ask the engine for its architecture: %v", ErrUnavailable, err)
	}
	engine := imagectl.NormalizeArch(v.Arch)
	agent, err := imagectl.BinaryArch(p.isolated.AgentBinary)
	if err != nil {
		return err
	}
	if agent != engine {
		return fmt.Errorf("berth-agent (%s) is built for %s but the engine runs %s: images would fail with \"exec format error\"; install berth for %s", p.isolated.AgentBinary, agent, engine, engine)
	}
	base := p.settings.Image
	if p.sandbox != nil {
		base = p.sandbox.BaseID
	}
	if base == "" {
		return nil
	}
	ictx, cancel := s.engineCtx(ctx)
	img, err := s.engine.ImageInspect(ictx, base)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: cannot inspect base image: %v", ErrUnavailable, err)
	}
	if got := imagectl.NormalizeArch(img.Architecture); got != "" && got != engine {
		name := p.settings.Image
		if p.sandbox != nil {
			name = p.sandbox.BaseRef
		}
		return fmt.Errorf("base image %s is built for %s but the engine runs %s: images would fail with \"exec format error\"; use a base for %s", name, got, engine, engine)
	}
	return nil
}

// buildSandbox builds the container image unless the engine has it, and
// returns how many steps it took.
func (s *Service) buildSandbox(ctx context.Context, p *plan, noCache bool, b *build, total uint32) (uint32, error) {
	sb := p.sandbox
	tag := sb.Tag()
	steps := buildSteps(sb.Dockerfile())
	var fetchStep uint32
	if len(sb.Packages) > 0 && sb.Source == imagectl.HostDebs {
		fetchStep = 1
	}
	if !noCache {
		ictx, cancel := s.engineCtx(ctx)
		_, err := s.engine.ImageInspect(ictx, tag)
		cancel()
		if err == nil {
			trace.SpanFromContext(ctx).SetAttributes(attribute.String("berth.image.outcome", outcomePresent))
			b.progress(steps+fetchStep, total, "container image "+tag+" is present")
			return steps + fetchStep, nil
		}
	}
	rec := Record{Tag: tag, Kind: imagectl.KindSandbox, Hash: sb.Hash(), Status: StatusBuilding, Inputs: sandboxInputs(sb)}
	if err := s.store.putImage(rec); err != nil {
		return 0, err
	}
	var debs []string
	if fetchStep == 1 {
		dir, err := os.MkdirTemp(mkdirAll(s.tmpDir), "debs-")
		if err != nil {
			return 0, s.failRecord(tag, nil, fmt.Errorf("cannot prepare a package directory: %w", err))
		}
		defer os.RemoveAll(dir)
		err = stage(ctx, spanFetch, func(ctx context.Context) (err error) {
			debs, err = s.fetchDebs(ctx, sb, dir, b, total)
			return err
		}, attribute.Int("berth.image.packages", len(sb.Packages)))
		if err != nil {
			return 0, err
		}
	}
	tail, id, err := s.stream(ctx, tag, func(w io.Writer) error { return sb.WriteContext(w, debs) },
		map[string]string{imagectl.LabelKind: imagectl.KindSandbox, imagectl.LabelHash: sb.Hash()}, noCache, s.buildNetwork(), b, fetchStep, total)
	if err := s.finishRecord(ctx, tag, id, tail, err); err != nil {
		return 0, err
	}
	if err != nil {
		return 0, err
	}
	return steps + fetchStep, nil
}

// fetchDebs has the host's apt fetch the packages sb's base lacks into
// dir (step 1 of the build); a failure is recorded on sb's image.
func (s *Service) fetchDebs(ctx context.Context, sb *imagectl.SandboxImage, dir string, b *build, total uint32) ([]string, error) {
	tag := sb.Tag()
	b.progress(1, total, "fetching "+strings.Join(sb.Packages, " ")+" with the host's apt")
	sctx, cancel := s.engineCtx(ctx)
	status, err := imagectl.BaseDpkgStatus(sctx, s.engine, sb.BaseRef, sb.BaseID)
	cancel()
	if err != nil {
		return nil, s.failRecord(tag, nil, err)
	}
	var lines []string
	debs, err := s.fetcher.Fetch(ctx, status, sb.Packages, dir, func(l string) {
		lines = append(lines, l)
		b.progress(1, total, l)
	})
	if err != nil {
		return nil, s.failRecord(tag, lastN(lines, imagectl.TailLines), err)
	}
	return debs, nil
}

// buildSteps is how many steps the builder announces for a Dockerfile: its
// instructions plus one LABEL per label (berth sets two: kind and hash).
func buildSteps(dockerfile string) uint32 {
	return uint32(imagectl.Steps(dockerfile)) + 2
}

func (s *Service) buildNetwork() string {
	if s.source == imagectl.BuildNetwork {
		return "default"
	}
	return "none"
}

func sandboxInputs(sb *imagectl.SandboxImage) map[string]string {
	in := map[string]string{
		"base":     sb.BaseRef,
		"base_id":  sb.BaseID,
		"packages": strings.Join(sb.Packages, " "),
		"template": fmt.Sprint(imagectl.SandboxTemplate),
	}
	var env []string
	for _, k := range slices.Sorted(maps.Keys(sb.Env)) {
		env = append(env, k+"="+sb.Env[k])
	}
	if len(env) > 0 {
		in["env"] = strings.Join(env, " ")
	}
	return in
}

// ensureAgentImage builds the default agent image when the engine lacks it.
func (s *Service) ensureAgentImage(ctx context.Context, p *plan) error {
	var buf bytes.Buffer
	if _, err := p.agentImage.Context(&buf); err != nil {
		return fmt.Errorf("cannot prepare the default agent image: %w", err)
	}
	tag := imagectl.Tag(p.agentHash)
	ictx, cancel := s.engineCtx(ctx)
	_, err := s.engine.ImageInspect(ictx, tag)
	cancel()
	if err == nil {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("berth.image.outcome", outcomePresent))
		return nil
	}
	rec := Record{Tag: tag, Kind: KindAgent, Hash: p.agentHash, Status: StatusBuilding,
		Inputs: map[string]string{"agent_binary": p.agentImage.AgentBinary, "busybox": p.agentImage.Busybox}}
	if rec.Inputs["busybox"] == "" {
		rec.Inputs["busybox"] = imagectl.DefaultBusybox
	}
	if err := s.store.putImage(rec); err != nil {
		return err
	}
	err = imagectl.Build(ctx, s.engine, &buf, tag, map[string]string{imagectl.LabelHash: p.agentHash, imagectl.LabelKind: KindAgent})
	return s.finishRecord(ctx, tag, "", nil, err)
}

// KindAgent is the default scratch+busybox agent image's kind.
const KindAgent = "agent"

// stream runs one engine build, reporting each line through b with the
// builder's step shifted by offset.
func (s *Service) stream(ctx context.Context, tag string, write func(io.Writer) error, labels map[string]string, noCache bool, network string, b *build, offset, total uint32) ([]string, string, error) {
	var tail []string
	id, err := imagectl.StreamBuild(ctx, s.engine, write, imagectl.StreamOptions{
		Tag: tag, Labels: labels, NoCache: noCache, Network: network,
		OnLine: func(line string) {
			tail = append(tail, line)
			if len(tail) > imagectl.TailLines {
				tail = tail[1:]
			}
			var step uint32
			if n, _, ok := imagectl.ParseStep(line); ok {
				step = offset + uint32(n)
			}
			b.progress(step, total, line)
		},
	})
	return tail, id, err
}

// finishRecord records a build's outcome: ready with the engine's size and
// time, or failed with the error and the last lines.
func (s *Service) finishRecord(ctx context.Context, tag, id string, tail []string, buildErr error) error {
	if buildErr != nil {
		return s.failRecord(tag, tail, buildErr)
	}
	ictx, cancel := s.engineCtx(ctx)
	img, err := s.engine.ImageInspect(ictx, tag)
	cancel()
	var size int64
	created := s.clock.Now().UTC()
	if err == nil {
		if img.Size > 0 {
			size = img.Size
		}
		if t, err := time.Parse(time.RFC3339Nano, img.Created); err == nil {
			created = t.UTC()
		}
	}
	return s.store.updateImage(tag, func(r *Record) {
		r.Status, r.Error, r.ID, r.Size, r.Created, r.LogTail = StatusReady, "", id, size, created, tail
	})
}

func (s *Service) failRecord(tag string, tail []string, buildErr error) error {
	var be *imagectl.BuildError
	if errors.As(buildErr, &be) && len(tail) == 0 {
		tail = be.Tail
	}
	if err := s.store.updateImage(tag, func(r *Record) {
		r.Status, r.Error, r.LogTail = StatusFailed, buildErr.Error(), tail
	}); err != nil {
		s.log.Error(err.Error())
	}
	return buildErr
}

func mkdirAll(dir string) string {
	_ = os.MkdirAll(dir, 0o700)
	return dir
}

func lastN(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// changed wakes the property publisher.
func (s *Service) changed() {
	select {
	case s.events <- struct{}{}:
	default:
	}
}

// Building is how many builds run now.
func (s *Service) Building() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.builds)
}
