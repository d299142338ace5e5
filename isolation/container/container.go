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
// Every container carries labels: berth.run (or berth.pool for a warm
// container that has no run yet), berth.agent, berth.config-hash and
// berth.instance (which scheduler made it), so Sweep can remove what a
// crashed scheduler left behind without touching anyone else's containers.
//
// With container_mode.warm = N the backend keeps N containers per agent
// started and blocked on their stdin (pool.go); a run takes one, and it is
// still removed after that one run.
package container

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/agentio"
)

// Name is the backend's config name.
const Name = "container"

// Labels on every container berth creates.
const (
	LabelRun        = "berth.run"
	LabelAgent      = "berth.agent"
	LabelConfigHash = "berth.config-hash"
	LabelInstance   = "berth.instance"
	// LabelPool marks a warm container started before any message reached
	// it; the value is the agent id. It has no berth.run label.
	LabelPool = "berth.pool"
)

// Reasons this backend adds to isolation's.
const (
	ReasonOutOfMemory = "out of memory"
	ReasonEngine      = "container engine unavailable"
	ReasonImage       = "container image unavailable"
)

// Limits every container gets.
const (
	DefaultPidsLimit = 256
	DefaultNanoCPUs  = 1_000_000_000 // one CPU
	TmpfsSize        = "256m"
	// MaxResponse caps what is read from the agent's stdout.
	MaxResponse = agentio.MaxResponse
	// StderrTail is how much of the agent's stderr is kept.
	StderrTail = agentio.StderrTail
	// ioGrace bounds how long output is drained after the container exited.
	ioGrace = 2 * time.Second
	// cleanupTimeout bounds kill and remove, which run even when the run's
	// context is done.
	cleanupTimeout = 30 * time.Second
	handlePrefix   = "container:"
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
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Backend runs agents in containers.
type Backend struct {
	cli      *client.Client
	instance string
	busybox  string
	log      *slog.Logger

	mu     sync.Mutex
	info   *system.Info
	infoAt time.Time
	images map[string]string // agent binary identity → image tag

	poolMu  sync.Mutex
	pools   map[string]*pool // agent id → its warm pool
	owned   map[string]bool  // ids of warm containers this process made and has not removed
	drained bool             // Drain ran and Warm did not since: no pool starts by itself
}

var _ isolation.Backend = (*Backend)(nil)

// New returns the container backend. It does not contact the engine: an
// engine that is down fails container runs, not the scheduler.
func New(opts Options) (*Backend, error) {
	cli := opts.Client
	if cli == nil {
		var err error
		if cli, err = client.New(client.FromEnv); err != nil {
			return nil, fmt.Errorf("cannot create Docker client: %w", err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Backend{
		cli:      cli,
		instance: InstanceLabel(opts.Instance),
		busybox:  opts.Busybox,
		log:      opts.Logger,
		images:   map[string]string{},
		pools:    map[string]*pool{},
		owned:    map[string]bool{},
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

// engineInfo returns the engine's info, cached for a little while: runtimes
// and architecture do not change between runs.
func (b *Backend) engineInfo(ctx context.Context) (system.Info, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.info != nil && time.Since(b.infoAt) < time.Minute {
		return *b.info, nil
	}
	res, err := b.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return system.Info{}, &isolation.RunError{Reason: ReasonEngine,
			Detail: fmt.Sprintf("cannot reach the Docker engine at %s: start it (systemctl start docker) or point DOCKER_HOST at it; landlock agents are not affected", b.cli.DaemonHost()),
			Err:    err}
	}
	b.info, b.infoAt = &res.Info, time.Now()
	return res.Info, nil
}

// Image returns the image an agent runs in: container_mode.image, else the
// berth-agent image built from agentBinary (built once per binary content).
func (b *Backend) Image(ctx context.Context, c config.Container, agentBinary string) (string, error) {
	if c.Image != "" {
		return c.Image, nil
	}
	fi, err := os.Stat(agentBinary)
	if err != nil {
		return "", &isolation.RunError{Reason: ReasonImage, Detail: fmt.Sprintf("cannot build the agent image: berth-agent %s is missing; set [scheduler] agent_binary or container_mode.image", agentBinary), Err: err}
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", agentBinary, fi.Size(), fi.ModTime().UnixNano())
	b.mu.Lock()
	defer b.mu.Unlock()
	if tag, ok := b.images[key]; ok {
		return tag, nil
	}
	tag, err := imagectl.Ensure(ctx, b.cli, imagectl.AgentImage{AgentBinary: agentBinary, Busybox: b.busybox})
	if err != nil {
		return "", &isolation.RunError{Reason: ReasonImage, Detail: "cannot build the berth-agent image; set container_mode.image to an image that exists (docker images) or fix the cause", Err: err}
	}
	b.images[key] = tag
	return tag, nil
}

// prepared is everything checked before a container is created.
type prepared struct {
	image  string
	config *container.Config
	host   *container.HostConfig
	hash   string
}

// prepare checks the engine, the image, its architecture and the runtime,
// and builds the container's configuration.
func (b *Backend) prepare(ctx context.Context, spec isolation.Spec) (prepared, error) {
	var p prepared
	c := spec.Container
	if err := checkGuards(c); err != nil {
		return p, err
	}
	if fi, err := os.Stat(spec.Workspace); err != nil || !fi.IsDir() || !filepath.IsAbs(spec.Workspace) {
		return p, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("workspace %q is not a directory", spec.Workspace), Err: err}
	}
	userSpec, err := containerUser(spec.RunAs)
	if err != nil {
		return p, err
	}
	memory, err := config.ParseMemoryLimit(firstNonEmpty(c.MemoryLimit, "512m"))
	if err != nil {
		return p, isolation.Errorf(isolation.ReasonStart, "%v", err)
	}
	info, err := b.engineInfo(ctx)
	if err != nil {
		return p, err
	}
	if c.Runtime != "" {
		if _, ok := info.Runtimes[c.Runtime]; !ok {
			return p, isolation.Errorf(isolation.ReasonStart, "container_mode.runtime %q is not registered with the engine (registered: %s); install it and add it to the engine's runtimes, or pick one of those",
				c.Runtime, strings.Join(sortedKeys(info.Runtimes), ", "))
		}
	}
	if p.image, err = b.Image(ctx, c, spec.AgentBinary); err != nil {
		return p, err
	}
	img, err := b.cli.ImageInspect(ctx, p.image)
	if cerrdefs.IsNotFound(err) {
		return p, isolation.Errorf(ReasonImage, "image %q is not in the engine: build or load it (docker build/load; no registry is used), or unset container_mode.image to use the built-in berth-agent image", p.image)
	}
	if err != nil {
		return p, &isolation.RunError{Reason: ReasonEngine, Detail: fmt.Sprintf("cannot inspect image %q", p.image), Err: err}
	}
	if got, want := normalizeArch(img.Architecture), normalizeArch(info.Architecture); got != want {
		return p, isolation.Errorf(isolation.ReasonStart, "image %q is built for %s but the engine runs on %s (it would fail with \"exec format error\"); build the image for %s", p.image, img.Architecture, info.Architecture, want)
	}

	securityOpt := []string{"no-new-privileges"}
	for _, opt := range c.SecurityOpt {
		o, err := engineSecurityOpt(opt)
		if err != nil {
			return p, err
		}
		securityOpt = append(securityOpt, o)
	}
	network := firstNonEmpty(c.Network, "bridge")
	pids := int64(DefaultPidsLimit)
	p.config = &container.Config{
		Image:       p.image,
		User:        userSpec,
		Env:         Environment(),
		WorkingDir:  config.ContainerWorkspace,
		OpenStdin:   true,
		StdinOnce:   true,
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Labels: map[string]string{
			LabelRun:      spec.RunID,
			LabelAgent:    spec.AgentID,
			LabelInstance: b.instance,
		},
	}
	p.host = &container.HostConfig{
		Binds:          append([]string{spec.Workspace + ":" + config.ContainerWorkspace + ":rw"}, c.Binds...),
		NetworkMode:    container.NetworkMode(network),
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{config.ContainerTmp: "rw,nosuid,nodev,size=" + TmpfsSize + ",mode=1777"},
		CapDrop:        []string{"ALL"},
		SecurityOpt:    securityOpt,
		Runtime:        c.Runtime,
		LogConfig:      container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     memory,
			MemorySwap: memory, // no swap on top of the limit
			PidsLimit:  &pids,
			NanoCPUs:   DefaultNanoCPUs,
		},
	}
	p.hash = configHash(img.ID, p.config, p.host)
	p.config.Labels[LabelConfigHash] = p.hash
	return p, nil
}

// Environment is the complete environment of a container agent. It holds no
// secret: the provider key travels on stdin only.
func Environment() []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + config.ContainerWorkspace,
		"TMPDIR=" + config.ContainerTmp,
		"LANG=C.UTF-8",
	}
}

// Run creates a fresh container for spec, hands it the request on stdin,
// waits for the response on stdout and removes the container.
func (b *Backend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	req := spec.Request
	if req.RunID == "" {
		req.RunID = spec.RunID
	}
	if req.RunID != spec.RunID {
		return isolation.Result{}, isolation.Errorf(isolation.ReasonStart, "request run id %q does not match run %q", req.RunID, spec.RunID)
	}
	req.Workspace = config.ContainerWorkspace
	req.Policy = isolation.ContainerPolicy(spec.Container)
	input, err := json.Marshal(req)
	if err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot encode request", Err: err}
	}
	p, err := b.prepare(ctx, spec)
	if err != nil {
		return isolation.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}

	if spec.Container.Warm > 0 {
		if warm := b.takeWarm(spec, p.hash); warm != nil {
			defer b.release(warm.id)
			if spec.OnStart != nil {
				spec.OnStart(handlePrefix + warm.id)
			}
			return b.finish(ctx, spec, warm, input)
		}
	}

	created, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: p.config, HostConfig: p.host, Name: containerName(spec.RunID)})
	if err != nil {
		return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot create container", Err: err}
	}
	id := created.ID
	defer b.release(id)
	if spec.OnStart != nil {
		spec.OnStart(handlePrefix + id)
	}
	sess, err := b.begin(ctx, id)
	if err != nil {
		return isolation.Result{}, err
	}
	return b.finish(ctx, spec, sess, input)
}

// session is a started container whose stdin is still open: attached and
// waited for before it started, so none of its output is lost.
type session struct {
	id       string
	hash     string // the config hash it was made with (warm members)
	attach   client.ContainerAttachResult
	wait     client.ContainerWaitResult
	stopWait context.CancelFunc
	stdout   *agentio.Stdout
	stderr   *agentio.Tail
	copied   chan struct{}
}

func (s *session) close() {
	s.attach.Close()
	s.stopWait()
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

// begin attaches to a created container, starts it and returns with the
// agent blocked on its stdin.
func (b *Backend) begin(ctx context.Context, id string) (*session, error) {
	attach, err := b.cli.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot attach to container", Err: err}
	}
	waitCtx, stopWait := context.WithCancel(context.Background())
	s := &session{
		id:       id,
		attach:   attach,
		wait:     b.cli.ContainerWait(waitCtx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit}),
		stopWait: stopWait,
		stdout:   agentio.NewStdout(),
		stderr:   agentio.NewTail(),
		copied:   make(chan struct{}),
	}
	go func() {
		defer close(s.copied)
		_, _ = stdcopy.StdCopy(s.stdout, s.stderr, attach.Reader)
	}()
	if _, err := b.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		s.close()
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot start container", Err: err}
	}
	return s, nil
}

// finish feeds a started container the request and collects the outcome.
func (b *Backend) finish(ctx context.Context, spec isolation.Spec, s *session, input []byte) (isolation.Result, error) {
	defer s.close()
	id := s.id
	go func() {
		_, _ = s.attach.Conn.Write(input)
		_ = s.attach.CloseWrite()
	}()

	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		timer := time.NewTimer(spec.Timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	var killed *isolation.RunError
	exitCode := -1
	select {
	case r := <-s.wait.Result:
		exitCode = int(r.StatusCode)
	case err := <-s.wait.Error:
		killed = &isolation.RunError{Reason: ReasonEngine, Detail: "lost the container while waiting for it", Err: err}
	case <-timeout:
		killed = isolation.Errorf(isolation.ReasonTimeout, "killed after %s", spec.Timeout)
	case <-ctx.Done():
		killed = &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}
	if killed != nil {
		b.kill(id)
	}
	select {
	case <-s.copied:
	case <-time.After(ioGrace):
		s.attach.Close()
		<-s.copied
	}
	stdout, stderr := s.stdout, s.stderr
	res := isolation.Result{ExitCode: exitCode, Stderr: stderr.String()}
	if killed != nil {
		killed.Detail = agentio.WithTail(killed.Detail, res.Stderr)
		return res, killed
	}
	out, err := agentio.Interpret(res, stdout, spec.RunID)
	if b.oomKilled(id, sigkilled(exitCode, out)) {
		return res, isolation.Errorf(ReasonOutOfMemory, "%s", agentio.WithTail(fmt.Sprintf("the container hit its memory limit of %s (container_mode.memory_limit)", firstNonEmpty(spec.Container.MemoryLimit, "512m")), res.Stderr))
	}
	return out, err
}

// oomKilled asks the engine whether the kernel OOM-killed a process of the
// container. The engine learns of an OOM kill asynchronously, so when
// something in the run died of SIGKILL it is asked again for a short while
// before the answer counts as no.
func (b *Backend) oomKilled(id string, suspect bool) bool {
	attempts := 1
	if suspect {
		attempts = 10
	}
	for i := 0; i < attempts; i++ {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		st, err := b.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		cancel()
		if err == nil && st.Container.State != nil && st.Container.State.OOMKilled {
			return true
		}
	}
	return false
}

// sigkilled reports whether the agent or one of its tools ended by SIGKILL,
// the way the OOM killer ends a process.
func sigkilled(exitCode int, res isolation.Result) bool {
	if exitCode == 128+9 {
		return true
	}
	for _, tc := range res.Response.ToolCalls {
		if strings.Contains(tc.Output, `"exit_code":137`) {
			return true
		}
	}
	return false
}

// kill stops a container now; remove follows in Run's defer.
func (b *Backend) kill(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if _, err := b.cli.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		b.log.Warn("cannot kill container", "container", id, "err", err)
	}
}

// remove deletes a container and its anonymous volumes, running or not.
func (b *Backend) remove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := removeContainer(ctx, b.cli, id); err != nil {
		b.log.Error("cannot remove container; the next scheduler start removes it", "container", id, "err", err)
	}
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
	if err := removeContainer(ctx, b.cli, id); err != nil {
		return fmt.Errorf("cannot remove container %s: %w", id, err)
	}
	return nil
}

// Sweep removes this instance's containers whose run keep does not claim:
// what a crashed scheduler left behind. It returns the runs it cleaned up.
func (b *Backend) Sweep(ctx context.Context, keep func(runID string) bool) ([]string, error) {
	list, err := b.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelInstance+"="+b.instance),
	})
	if err != nil {
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
			if err := removeContainer(ctx, b.cli, c.ID); err != nil {
				errs = append(errs, fmt.Errorf("cannot remove container %s: %w", c.ID, err))
				continue
			}
			b.log.Info("removed a warm container left behind by an earlier scheduler", "container", c.ID, "agent", c.Labels[LabelPool])
			continue
		}
		if keep != nil && keep(run) {
			continue
		}
		if err := removeContainer(ctx, b.cli, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("cannot remove container %s of run %s: %w", c.ID, run, err))
			continue
		}
		removed = append(removed, run)
	}
	return removed, errors.Join(errs...)
}

// checkGuards re-applies the config guards: a config that bypassed
// validation still never reaches the engine.
func checkGuards(c config.Container) error {
	if msg := config.CheckNetwork(firstNonEmpty(c.Network, "bridge")); msg != "" {
		return isolation.Errorf(isolation.ReasonStart, "container_mode.network: %s", msg)
	}
	for _, bind := range c.Binds {
		if msg := config.CheckBind(bind); msg != "" {
			return isolation.Errorf(isolation.ReasonStart, "container_mode.binds: %s", msg)
		}
	}
	for _, opt := range c.SecurityOpt {
		if msg := config.CheckSecurityOpt(opt); msg != "" {
			return isolation.Errorf(isolation.ReasonStart, "container_mode.security_opt: %s", msg)
		}
	}
	return nil
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

// containerUser is "uid:gid" of the run user, never root.
func containerUser(runAs string) (string, error) {
	if runAs == "" {
		return "", isolation.Errorf(isolation.ReasonStart, "no run_as user: container agents never run as root")
	}
	u, err := user.Lookup(runAs)
	if err != nil {
		if _, perr := strconv.ParseUint(runAs, 10, 32); perr == nil {
			u, err = user.LookupId(runAs)
		}
	}
	if err != nil {
		return "", &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot find run_as user %q", runAs), Err: err}
	}
	if u.Uid == "0" {
		return "", isolation.Errorf(isolation.ReasonStart, "run_as user %q is root; container agents run only as an unprivileged user", runAs)
	}
	return u.Uid + ":" + u.Gid, nil
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

// normalizeArch maps the names engines and images use to one spelling.
func normalizeArch(a string) string {
	switch strings.ToLower(a) {
	case "x86_64", "x86-64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "armv7l", "armhf", "arm":
		return "arm"
	case "i386", "i686", "386":
		return "386"
	}
	return strings.ToLower(a)
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
