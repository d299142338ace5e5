package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// A kept pod is a conversation's sandbox on kubernetes (ADR 21, ADR 29): one
// pod that stays running between requests, berth-agent in serve mode taking
// one request per line on its stdin, which berth attached to once, before
// the opening request; no API call is made per request. The pod shares its
// process namespace, so the pod's pause process is PID 1 and reaps what the
// tools leave behind (the part tini plays for a kept container), and
// berth-agent passes SIGTERM on to every other process of the pod
// (agentproto.ServePIDNamespaceArg).
//
// Its stdin closes when the attach stream ends (stdinOnce), so berth-agent
// reads EOF and exits when its scheduler is gone: a dead scheduler's kept
// pods end by themselves and are deleted by Kill(handle) or Sweep, which
// find them by their labels (berth.kept=1, berth.run=<sandbox id>,
// berth.instance). A kept pod is never reattached, as a kept container
// is not.

// LabelKept marks a kept sandbox's pod; its berth.run is the sandbox's id.
const LabelKept = "berth.kept"

// keptGrace is the kept pod's terminationGracePeriodSeconds: the most the
// kubelet waits after SIGTERM when berth cannot cut it short (Stop kills
// after its own grace with a deletion of grace 0).
const keptGrace = 60

var _ isolation.Keeper = (*Backend)(nil)

// KeptPodFor is the pod of a plan's kept sandbox, without its name.
func KeptPodFor(spec isolation.Spec, instance string) (*corev1.Pod, error) {
	pod, _, err := PodFor(spec.Plan, instance)
	if err != nil {
		return nil, err
	}
	pod.Labels[LabelRun] = labelValue(spec.RunID)
	pod.Labels[LabelAttempt] = strconv.Itoa(spec.Attempt)
	pod.Labels[LabelKept] = "1"
	pod.Spec.ShareProcessNamespace = ptr(true)
	pod.Spec.TerminationGracePeriodSeconds = ptr(int64(keptGrace))
	// Its life is the scheduler's to end (idle stop, max lifetime), and
	// it ends by itself when the scheduler is gone (stdinOnce).
	pod.Spec.ActiveDeadlineSeconds = nil
	// No files container: the agent's serves between requests, so files
	// go in and out through it (files.go), and a container that outlived
	// it would keep the pod of a dead scheduler from ending.
	pod.Spec.Containers = pod.Spec.Containers[:1]
	c := &pod.Spec.Containers[0]
	c.Args = []string{agentproto.ServeArg, agentproto.ServePIDNamespaceArg}
	c.Stdin, c.StdinOnce = true, true
	return pod, nil
}

// Start opens a kept sandbox for spec (isolation.Keeper): a pod of the
// plan's hardening and limits whose berth-agent serves requests until it
// is stopped; the plan's timeout bounds each request, not the pod.
func (b *Backend) Start(ctx context.Context, spec isolation.Spec) (isolation.Kept, error) {
	pod, err := KeptPodFor(spec, b.instance)
	if err != nil {
		return nil, err
	}
	if b.host != "" { // this host's, as podFor labels a run's (ADR 28)
		pod.Labels[LabelHost] = b.host
	}
	if err := b.claim(ctx, spec.Plan); err != nil { // the agent's lease, hosts.go
		return nil, err
	}
	if err := b.ready(ctx, spec.Plan); err != nil {
		return nil, err
	}
	pod.Name = podName("kept-" + isolation.AttemptName(spec.RunID, spec.Attempt))
	b.own(pod.Name)
	s, err := b.createAndWait(ctx, pod, spec.Plan)
	if err != nil {
		b.disown(pod.Name)
		return nil, err
	}
	out := isolation.NewKeptOutput()
	stdinR, stdinW := io.Pipe()
	body := &keptPod{s: s, stdin: stdinR, exited: make(chan struct{})}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	body.stopWatch = stopWatch
	go body.attach(stdinR, out.Stdout(), out.Stderr())
	go body.watch(watchCtx)
	k, err := isolation.OpenKept(ctx, spec, body, stdinW, out)
	if err != nil {
		return nil, err
	}
	return filesKept{Kept: k, s: s}, nil // files.go
}

// keptPod is a kept sandbox's pod.
type keptPod struct {
	s         *session
	stdin     *io.PipeReader
	stopWatch context.CancelFunc

	exitOnce sync.Once
	exited   chan struct{}
	exit     isolation.Exit

	releaseOnce sync.Once
}

// ended records how the agent ended, once, and closes exited.
func (k *keptPod) ended(exit isolation.Exit) {
	k.exitOnce.Do(func() {
		k.exit = exit
		close(k.exited)
	})
}

// attach is the stream the sandbox's requests and answers travel: it lasts
// as long as the sandbox. A stream that fails leaves the agent unreachable,
// so it counts as the sandbox's end.
func (k *keptPod) attach(stdin io.Reader, stdout, stderr io.Writer) {
	s := k.s
	defer close(s.copied)
	exec, err := s.b.executor(s.ns, s.name)
	if err == nil {
		err = exec.StreamWithContext(s.streamCtx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	}
	if s.streamCtx.Err() != nil {
		return
	}
	if err == nil {
		err = errors.New("the stream ended")
	}
	// The agent has the chance to report its own exit first (the stream
	// ends with it); a stream lost under a running agent ends the sandbox.
	select {
	case <-k.exited:
	case <-time.After(s.b.apiTimeout):
		s.b.log.Warn("lost the attach stream of a kept pod; it takes no more requests", "pod", s.name, "err", err)
		k.ended(isolation.Exit{Code: -1, NeverRan: fmt.Sprintf("lost the attach stream of pod %s/%s: %v", s.ns, s.name, err)})
	}
}

// watch follows the pod until its agent container ended or the pod is gone.
func (k *keptPod) watch(ctx context.Context) {
	s := k.s
	var exit isolation.Exit
	_, err := s.b.watchPod(ctx, s.ns, s.name, func(pod *corev1.Pod) (bool, error) {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == agentContainer && t != nil {
				exit = isolation.Exit{Code: int(t.ExitCode), OOM: t.Reason == "OOMKilled"}
				if t.Signal != 0 {
					exit.Signal = syscall.Signal(t.Signal)
				} else if t.ExitCode == 128+9 {
					exit.Signal = syscall.SIGKILL
				}
				return true, nil
			}
		}
		if pod.Status.Phase == corev1.PodFailed {
			exit = isolation.Exit{Code: -1, NeverRan: fmt.Sprintf("the pod failed (%s: %s)", pod.Status.Reason, pod.Status.Message)}
			return true, nil
		}
		return false, nil
	})
	switch {
	case errors.Is(err, errGone):
		exit = isolation.Exit{Code: -1, Signal: syscall.SIGKILL}
		if !s.killed.Load() {
			exit.NeverRan = fmt.Sprintf("pod %s/%s was deleted (its node was lost, or someone deleted it)", s.ns, s.name)
		}
	case err != nil && ctx.Err() != nil:
		return // released: Release ends it
	case err != nil:
		exit = isolation.Exit{Code: -1, NeverRan: fmt.Sprintf("lost pod %s/%s: %v", s.ns, s.name, err)}
	}
	k.ended(exit)
}

func (k *keptPod) Handle() string             { return k.s.Handle() }
func (k *keptPod) Exited() <-chan struct{}    { return k.exited }
func (k *keptPod) ExitStatus() isolation.Exit { return k.exit }

// Terminate deletes the pod with its grace: the kubelet sends SIGTERM to
// berth-agent, which passes it on to every other process of the pod and
// exits once they are gone; Kill cuts the grace short.
func (k *keptPod) Terminate(ctx context.Context) error {
	s := k.s
	ctx, cancel := s.b.call(ctx)
	defer cancel()
	s.killed.Store(true)
	err := s.b.cs.CoreV1().Pods(s.ns).Delete(ctx, s.name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(keptGrace))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cannot delete pod %s/%s with a grace: %w", s.ns, s.name, err)
	}
	return nil
}

// WaitEnded returns once the agent's container has ended (or its pod is
// gone): with the pod's process namespace shared, the container's other
// processes end with it.
func (k *keptPod) WaitEnded(ctx context.Context) error {
	select {
	case <-k.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill deletes the pod at once (grace 0, which also shortens a deletion
// under way).
func (k *keptPod) Kill(ctx context.Context) error { return k.s.Kill(ctx) }

func (k *keptPod) OOMKilled(ctx context.Context) bool { return k.s.Inspect(ctx, true) }

// Memory is the agent container's working set (memory.go).
func (k *keptPod) Memory(ctx context.Context) (int64, error) {
	return k.s.b.podMemory(ctx, k.s.ns, k.s.name)
}

// Release ends the attach stream and the watch and deletes the pod before
// it returns: a stopped sandbox leaves nothing.
func (k *keptPod) Release() {
	k.releaseOnce.Do(func() {
		s := k.s
		s.released.Do(func() {})
		s.stopStream()
		k.stopWatch()
		_ = k.stdin.Close()
		if err := s.b.deletePod(s.ns, s.name); err != nil {
			s.b.log.Error("cannot delete a kept pod; the next scheduler start removes it", "pod", s.name, "err", err)
		}
		s.b.disown(s.name)
		// Done closes even when the pod's end was never seen.
		k.ended(isolation.Exit{Code: -1, Signal: syscall.SIGKILL})
	})
}
