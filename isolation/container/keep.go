package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// A kept container is one container per sandbox that stays running between
// requests: berth-agent in serve mode under the engine's init (tini), which
// reaps what tools leave behind and passes SIGTERM on. Requests go in over
// the stream attached before the container started, one line each — no
// engine call per request (a docker exec per request costs a round trip to
// the engine and a new process; ADR 21). It carries LabelKept; Backend.Kill
// removes it by its handle. It is not reattached after a scheduler
// restart: its attach stream was the dead scheduler's.

// LabelKept marks a kept sandbox's container; its berth.run is the
// sandbox's id.
const LabelKept = "berth.kept"

var _ isolation.Keeper = (*Backend)(nil)

// Start opens a kept sandbox for spec (isolation.Keeper): a container of
// the plan's hardening and limits, with the plan's timeout bounding each
// request rather than the container.
func (b *Backend) Start(ctx context.Context, spec isolation.Spec) (isolation.Kept, error) {
	p, err := b.prepare(ctx, spec.Plan)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonCanceled, Err: context.Cause(ctx)}
	}
	p.config.Cmd = []string{agentproto.ServeArg, agentproto.ServePIDNamespaceArg}
	p.config.StdinOnce = false
	p.config.Labels[LabelKept] = "1"
	withInit := true
	p.host.Init = &withInit
	createCtx, cancel := b.call(context.WithoutCancel(ctx))
	c, err := b.cli.ContainerCreate(createCtx, client.ContainerCreateOptions{Config: p.config, HostConfig: p.host, Name: containerName(isolation.AttemptName(spec.RunID, spec.Attempt))})
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, b.unavailable("create the container", err)
		}
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot create container", Err: err}
	}
	b.own(c.ID)
	s, err := b.begin(ctx, c.ID)
	if err != nil {
		b.release(c.ID)
		return nil, err
	}
	s.b, s.runID = b, spec.RunID
	out := isolation.NewKeptOutput()
	s.output(out.Stdout(), out.Stderr())
	body := &keptContainer{s: s, exited: make(chan struct{})}
	go body.watch()
	return isolation.OpenKept(ctx, spec, body, attachedStdin{s}, out)
}

// attachedStdin is the container's stdin over the attach stream.
type attachedStdin struct{ s *session }

func (w attachedStdin) Write(p []byte) (int, error) { return w.s.attach.Conn.Write(p) }
func (w attachedStdin) Close() error                { return w.s.attach.CloseWrite() }

// keptContainer is a kept sandbox's container.
type keptContainer struct {
	s      *session
	exited chan struct{}
	exit   isolation.Exit

	releaseOnce sync.Once
}

// watch waits for the container's exit, once, for Exited and WaitEnded.
func (k *keptContainer) watch() {
	select {
	case r := <-k.s.wait.Result:
		k.exit = isolation.Exit{Code: int(r.StatusCode)}
		if r.StatusCode == 128+9 {
			k.exit.Signal = 9
		}
	case err := <-k.s.wait.Error:
		k.exit = isolation.Exit{Code: -1, NeverRan: fmt.Sprintf("lost the container while waiting for it: %v", err)}
	}
	close(k.exited)
}

func (k *keptContainer) Handle() string             { return k.s.Handle() }
func (k *keptContainer) Exited() <-chan struct{}    { return k.exited }
func (k *keptContainer) ExitStatus() isolation.Exit { return k.exit }

// Terminate sends SIGTERM to the container's init, which passes it to
// berth-agent, which passes it on to every other process and waits for
// them (agentproto.ServePIDNamespaceArg).
func (k *keptContainer) Terminate(ctx context.Context) error {
	ctx, cancel := k.s.b.call(ctx)
	defer cancel()
	if _, err := k.s.b.cli.ContainerKill(ctx, k.s.id, client.ContainerKillOptions{Signal: "TERM"}); err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		return fmt.Errorf("cannot send SIGTERM to container %s: %w", k.s.id, err)
	}
	return nil
}

// WaitEnded returns once the container has exited: its init was the last
// of its processes.
func (k *keptContainer) WaitEnded(ctx context.Context) error {
	select {
	case <-k.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *keptContainer) Kill(ctx context.Context) error { return k.s.Kill(ctx) }

func (k *keptContainer) OOMKilled(ctx context.Context) bool { return k.s.Inspect(ctx, true) }

// Memory is the container's memory use as the engine reports it (its
// cgroup's: every process and its /tmp tmpfs).
func (k *keptContainer) Memory(ctx context.Context) (int64, error) {
	ctx, cancel := k.s.b.call(ctx)
	defer cancel()
	res, err := k.s.b.cli.ContainerStats(ctx, k.s.id, client.ContainerStatsOptions{})
	if err != nil {
		return 0, fmt.Errorf("cannot read the memory of container %s: %w", k.s.id, err)
	}
	defer res.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&st); err != nil {
		return 0, fmt.Errorf("cannot read the memory of container %s: %w", k.s.id, err)
	}
	return int64(st.MemoryStats.Usage), nil
}

// Release closes the streams and removes the container, before it returns:
// a stopped sandbox leaves nothing.
func (k *keptContainer) Release() {
	k.releaseOnce.Do(func() {
		k.s.released.Do(func() {})
		k.s.close()
		k.s.b.release(k.s.id)
	})
}
