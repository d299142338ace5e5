// Package kube is the isolation backend that runs every request in a pod of
// a Kubernetes cluster, through client-go (no kubectl), and deletes the pod
// when the run ends, whatever happened (ADR 22).
//
// A run's pod is built from the same isolation.Plan the other backends
// take, hardened as the Docker backend's container is: a non-root uid (the
// plan's), a read-only root, no privilege escalation, every capability
// dropped, seccomp RuntimeDefault, no service account token, the plan's
// memory and CPU as requests and limits, /tmp a memory emptyDir of the
// plan's size. The request goes to berth-agent's stdin over pods/attach and
// the response comes back on its stdout — never in the spec, env, args,
// labels or annotations, which a test reads back from the API server.
//
// Every pod carries labels: berth.run and berth.attempt (or berth.pool for
// a warm pod that has no run yet), berth.agent, berth.config-hash and
// berth.instance, so Sweep removes what a crashed scheduler left behind
// without touching anyone else's pods. Every API call has a deadline; a
// cluster that does not answer fails runs with
// isolation.ReasonClusterUnavailable.
//
// Pods reach nothing but berth's egress router (egress.go): a
// NetworkPolicy per namespace allows only its address, and because the
// cluster may not enforce NetworkPolicy, the backend fails closed unless a
// probe pod showed that direct connections fail while the router answers
// (or the admin vouched for the cluster: egress_verified_by = "admin").
package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-dev/berth/isolation"
)

// Name is the backend's config name.
const Name = string(isolation.BackendKubernetes)

// Labels on every pod berth creates.
const (
	LabelRun        = "berth.run"
	LabelAttempt    = "berth.attempt"
	LabelAgent      = "berth.agent"
	LabelConfigHash = "berth.config-hash"
	LabelInstance   = "berth.instance"
	// LabelPool marks a warm pod started before any message reached it;
	// the value is the agent id. It has no berth.run label.
	LabelPool = "berth.pool"
	// LabelProbe marks the pod that checks pods have no way out.
	LabelProbe = "berth.probe"
)

// Defaults of Options.
const (
	DefaultAPITimeout   = 10 * time.Second
	DefaultStartTimeout = 90 * time.Second
	// DefaultUnreachable is how long the API server may fail every call
	// of a run's watch before the run fails with ReasonClusterUnavailable.
	DefaultUnreachable = 30 * time.Second
	handlePrefix       = "kubernetes:"
	agentContainer     = "agent"
	watchWindow        = 60 * time.Second
)

// Options configure the backend.
type Options struct {
	// Config reaches the API server; nil means Kubeconfig, else the
	// in-cluster config.
	Config     *rest.Config
	Kubeconfig string
	// Instance names the scheduler that owns the pods (its state
	// directory); Sweep only removes pods of the same instance.
	Instance string
	// HostID names this berth host among those sharing the cluster
	// ([kubernetes] host_id, ADR 28; see HostID): its pods carry it as
	// LabelHost, Sweep and Kill touch no pod without it, and runs start
	// only while it holds the agent's Lease. "" is a backend alone on its
	// cluster: no label, no lease.
	HostID string
	// Namespace is swept at start; runs use their plan's namespace (the
	// same one unless the config changed since).
	Namespace string
	// ProxyHost is the address of berth's egress router as pods reach it
	// ([kubernetes] proxy_listen's host): the probe checks it answers.
	ProxyHost string
	// APITimeout bounds each short API call; StartTimeout how long a pod
	// may take to run berth-agent (scheduling, pulling); Unreachable how
	// long the API server may fail a run's every call. Zero is the default.
	APITimeout   time.Duration
	StartTimeout time.Duration
	Unreachable  time.Duration
	Logger       *slog.Logger
}

// Backend runs agents in pods.
type Backend struct {
	cs          kubernetes.Interface
	rest        *rest.Config
	instance    string
	host        string // berth.host of its pods, "" for none (ADR 28)
	namespace   string
	proxyHost   string
	apiTimeout  time.Duration
	start       time.Duration
	unreachable time.Duration
	log         *slog.Logger

	mu         sync.Mutex // guards what follows; never held across an API call
	namespaces map[string]bool
	verified   map[string]bool // namespace → the probe passed
	policies   map[string]string
	owned      map[string]bool // pod names this process still ends
	pools      map[string]*pool
	claims     map[string]bool     // namespace/name of workspace claims known to exist
	takes      isolation.PoolTakes // agent id → its runs' hits and misses of the pool
	drained    bool

	removals sync.WaitGroup
	leases   leases // lease.go
}

var _ isolation.Backend = (*Backend)(nil)

// New returns the kubernetes backend. It does not contact the cluster: a
// cluster that is down fails kubernetes runs, not the scheduler.
func New(opts Options) (*Backend, error) {
	cfg := opts.Config
	if cfg == nil {
		var err error
		if opts.Kubeconfig != "" {
			cfg, err = clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
		} else {
			cfg, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("cannot load the cluster's client config ([kubernetes] kubeconfig): %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot create the Kubernetes client: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	if opts.HostID != "" && labelValue(opts.HostID) != opts.HostID {
		return nil, fmt.Errorf("host id %q is not a Kubernetes label value ([kubernetes] host_id)", opts.HostID)
	}
	b := &Backend{
		cs: cs, rest: cfg, instance: instanceOf(opts.HostID, opts.Instance), host: opts.HostID, namespace: opts.Namespace, proxyHost: opts.ProxyHost,
		apiTimeout: opts.APITimeout, start: opts.StartTimeout, unreachable: opts.Unreachable, log: opts.Logger,
		namespaces: map[string]bool{opts.Namespace: true}, verified: map[string]bool{}, policies: map[string]string{},
		owned: map[string]bool{}, pools: map[string]*pool{}, claims: map[string]bool{},
	}
	if b.apiTimeout <= 0 {
		b.apiTimeout = DefaultAPITimeout
	}
	if b.start <= 0 {
		b.start = DefaultStartTimeout
	}
	if b.unreachable <= 0 {
		b.unreachable = DefaultUnreachable
	}
	return b, nil
}

// InstanceLabel is the berth.instance value of a scheduler instance name.
func InstanceLabel(instance string) string {
	sum := sha256.Sum256([]byte(instance))
	return hex.EncodeToString(sum[:8])
}

// Name returns "kubernetes".
func (b *Backend) Name() string { return Name }

// Clientset is the client the backend uses.
func (b *Backend) Clientset() kubernetes.Interface { return b.cs }

func (b *Backend) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.apiTimeout)
}

// unavailable is the RunError of an API server that did not answer.
func (b *Backend) unavailable(what string, err error) *isolation.RunError {
	return &isolation.RunError{Reason: isolation.ReasonClusterUnavailable,
		Detail: fmt.Sprintf("cannot %s: the API server at %s did not answer within %s; check the cluster and [kubernetes] kubeconfig; other backends are not affected", what, b.rest.Host, b.apiTimeout),
		Err:    err}
}

// apiError maps an API error to a RunError: unreachable, or refused.
func (b *Backend) apiError(what string, err error) *isolation.RunError {
	if isUnreachable(err) {
		return b.unavailable(what, err)
	}
	return &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot " + what, Err: err}
}

// isUnreachable says err is the API server not answering (rather than
// answering no).
func isUnreachable(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
	}
	return err != nil
}

// Run creates a pod for spec (or takes a warm one) and lets
// isolation.Supervise hand it the request, wait for the response, kill and
// drain it; the pod is deleted whatever happened.
func (b *Backend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	return b.superviseWithFiles(ctx, spec) // files.go
}

// Environment is the complete environment of a pod's agent. It holds no
// secret: the provider key travels on stdin only.
func Environment() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "PATH", Value: "/usr/local/bin:/usr/bin:/bin"},
		{Name: "HOME", Value: isolation.ContainerWorkspace},
		{Name: "TMPDIR", Value: isolation.ContainerTmp},
		{Name: "LANG", Value: "C.UTF-8"},
	}
}

// checkPlan refuses what this backend cannot run safely.
func checkPlan(p isolation.Plan) error {
	if err := p.RequireLimits(); err != nil {
		return err
	}
	if p.Limits.TmpfsBytes <= 0 {
		return isolation.Errorf(isolation.ReasonStart, "cannot run the plan of run %s: it gives /tmp no size", p.RunID)
	}
	if p.Kube.Image == "" {
		return isolation.Errorf(isolation.ReasonImageUnavailable, "agent %s has no image for its pods: set container_mode.image or [agents.image_config] image to an image the cluster's nodes have", p.AgentID)
	}
	if p.Kube.Namespace == "" {
		return isolation.Errorf(isolation.ReasonStart, "the plan of run %s names no namespace ([kubernetes] namespace)", p.RunID)
	}
	if p.Network.Allowed {
		return isolation.Errorf(isolation.ReasonConfinement, "a kubernetes run never has a direct network; its way out is berth's egress router")
	}
	_, _, err := podUser(p)
	return err
}

// podUser is the plan's uid and gid, never root.
func podUser(p isolation.Plan) (int64, int64, error) {
	u := p.User
	if u == nil {
		if p.RunAs == "" {
			return 0, 0, isolation.Errorf(isolation.ReasonStart, "no run_as user: kubernetes agents never run as root")
		}
		var err error
		if u, err = isolation.LookupRunUser(p.RunAs); err != nil {
			return 0, 0, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot find run_as user %q", p.RunAs), Err: err}
		}
	}
	if u.UID == 0 || u.GID == 0 {
		return 0, 0, isolation.Errorf(isolation.ReasonStart, "run_as user %q is root; kubernetes agents run only as an unprivileged user", u.Name)
	}
	return int64(u.UID), int64(u.GID), nil
}

func ptr[T any](v T) *T { return &v }

// PodFor is the pod of a plan, without its name and run labels; hash is
// what it was made from (a warm pod whose hash differs is stale).
func PodFor(p isolation.Plan, instance string) (pod *corev1.Pod, hash string, err error) {
	if err := checkPlan(p); err != nil {
		return nil, "", err
	}
	uid, gid, _ := podUser(p)
	k := p.Kube
	mem := resource.NewQuantity(p.Limits.MemoryBytes, resource.BinarySI)
	cpu := resource.NewMilliQuantity(p.Limits.NanoCPUs/1_000_000, resource.DecimalSI)
	res := corev1.ResourceList{corev1.ResourceMemory: *mem, corev1.ResourceCPU: *cpu}
	var tolerations []corev1.Toleration
	for _, t := range k.Tolerations {
		tolerations = append(tolerations, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	var runtimeClass *string
	if k.RuntimeClass != "" {
		runtimeClass = ptr(k.RuntimeClass)
	}
	tmp := resource.NewQuantity(p.Limits.TmpfsBytes, resource.BinarySI)
	// A backstop for a scheduler that died: the kubelet ends the pod after
	// the run's timeout and grace even when nobody deletes it.
	deadline := int64((p.Timeout + p.KillGrace + time.Minute) / time.Second)
	if p.Timeout <= 0 {
		deadline = 3600
	}
	pullPolicy := corev1.PullPolicy(k.ImagePullPolicy)
	if pullPolicy == "" {
		pullPolicy = corev1.PullIfNotPresent
	}
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: k.Namespace,
			Labels:    map[string]string{LabelAgent: labelValue(p.AgentID), LabelInstance: instance},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			ServiceAccountName:            k.ServiceAccount,
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(1)),
			ActiveDeadlineSeconds:         ptr(deadline),
			RuntimeClassName:              runtimeClass,
			NodeSelector:                  k.NodeSelector,
			Tolerations:                   tolerations,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr(true),
				RunAsUser:      ptr(uid),
				RunAsGroup:     ptr(gid),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            agentContainer,
				Image:           k.Image,
				ImagePullPolicy: pullPolicy,
				Stdin:           true,
				StdinOnce:       true,
				WorkingDir:      isolation.ContainerWorkspace,
				Env:             Environment(),
				Resources:       corev1.ResourceRequirements{Requests: res, Limits: res},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             ptr(true),
					RunAsUser:                ptr(uid),
					RunAsGroup:               ptr(gid),
					ReadOnlyRootFilesystem:   ptr(true),
					AllowPrivilegeEscalation: ptr(false),
					Privileged:               ptr(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workspace", MountPath: isolation.ContainerWorkspace},
					{Name: "tmp", MountPath: isolation.ContainerTmp},
				},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
			Volumes: []corev1.Volume{
				{Name: "workspace", VolumeSource: workspaceVolume(p)},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: tmp}}},
			},
		},
	}
	caVolumeFor(pod, p)
	withFilesContainer(pod) // files.go, ADR 29
	if usesClaim(p) {
		// A volume that supports it is made the group's: the run user
		// writes a fresh claim the provisioner made root's.
		pod.Spec.SecurityContext.FSGroup = ptr(gid)
		pod.Spec.SecurityContext.FSGroupChangePolicy = ptr(corev1.FSGroupChangeOnRootMismatch)
	}
	data, _ := json.Marshal(pod.Spec)
	sum := sha256.Sum256(data)
	hash = hex.EncodeToString(sum[:8])
	pod.Labels[LabelConfigHash] = hash
	return pod, hash, nil
}

// labelValue is s as a label value may hold it (63 characters of
// [A-Za-z0-9_.-], alphanumeric at both ends).
func labelValue(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			out[i] = '_'
		}
	}
	v := strings.Trim(string(out[:min(len(out), 63)]), "-_.")
	return v
}

// podName is a fresh pod name for what (a run's attempt name, or warm-<agent>).
func podName(what string) string {
	var r [3]byte
	_, _ = rand.Read(r[:])
	name := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			return c
		case c >= 'A' && c <= 'Z':
			return c + 'a' - 'A'
		}
		return '-'
	}, what)
	name = strings.Trim(name[:min(len(name), 48)], "-")
	return "berth-" + name + "-" + hex.EncodeToString(r[:])
}

// startRun is the StartFunc of kubernetes runs.
func (b *Backend) startRun(ctx context.Context, spec isolation.Spec, input []byte, stdout, stderr io.Writer) (isolation.Sandbox, error) {
	began := time.Now()
	pod, hash, err := b.podFor(spec.Plan)
	if err != nil {
		return nil, err
	}
	if err := b.claim(ctx, spec.Plan); err != nil { // hosts.go, ADR 28
		return nil, err
	}
	if err := b.ready(ctx, spec.Plan); err != nil {
		return nil, err
	}
	var s *session
	if spec.Kube.Warm > 0 && spec.Egress == nil {
		s = b.takeWarm(spec, hash)
	}
	warm := s != nil
	if s == nil {
		pod.Name = podName(isolation.AttemptName(spec.RunID, spec.Attempt))
		pod.Labels[LabelRun] = labelValue(spec.RunID)
		pod.Labels[LabelAttempt] = strconv.Itoa(spec.Attempt)
		if s, err = b.createAndWait(ctx, pod, spec.Plan); err != nil {
			return nil, err
		}
	}
	s.runID = spec.RunID
	if err := s.putFiles(ctx, spec.Files); err != nil { // files.go
		s.Release()
		return nil, err
	}
	s.holdForFiles(spec.Files)
	s.attach(input, stdout, stderr)
	b.log.Debug("pod has its request", "run_id", spec.RunID, "pod", s.name, "warm", warm, "total_ms", float64(time.Since(began).Microseconds())/1000)
	return endingLater{s}, nil
}

// createAndWait creates pod and waits until berth-agent runs in it.
func (b *Backend) createAndWait(ctx context.Context, pod *corev1.Pod, p isolation.Plan) (*session, error) {
	b.mu.Lock()
	b.namespaces[pod.Namespace] = true
	b.mu.Unlock()
	if err := b.ensureClaim(ctx, p); err != nil {
		return nil, err
	}
	certs, err := readCA(p)
	if err != nil {
		return nil, err
	}
	// Not ctx: a create canceled halfway may still happen in the API
	// server, and a pod whose name we never learnt... we know it: delete it.
	createCtx, cancel := b.call(context.WithoutCancel(ctx))
	created, err := b.cs.CoreV1().Pods(pod.Namespace).Create(createCtx, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return nil, b.apiError(fmt.Sprintf("create pod %s/%s", pod.Namespace, pod.Name), err)
	}
	if err := b.createCA(ctx, created, p, certs); err != nil {
		b.deletePod(pod.Namespace, pod.Name)
		return nil, err
	}
	s := newSession(b, pod.Namespace, pod.Name)
	s.filesIn = filesContainerOf(pod)
	if err := b.waitRunning(ctx, s, p); err != nil {
		b.deletePod(pod.Namespace, pod.Name)
		return nil, err
	}
	return s, nil
}

// waitRunning waits until the pod's agent container runs, failing on what
// will not get better by waiting (a missing image, a refused container).
func (b *Backend) waitRunning(ctx context.Context, s *session, p isolation.Plan) error {
	limit := b.start
	if p.Timeout > 0 && p.Timeout < limit {
		limit = p.Timeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, limit, errStartTimeout)
	defer cancel()
	var last *corev1.Pod
	_, err := b.watchPod(ctx, s.ns, s.name, func(pod *corev1.Pod) (bool, error) {
		last = pod
		return filesStarted(pod, p)
	})
	if err == nil {
		return nil
	}
	if errors.Is(context.Cause(ctx), errStartTimeout) {
		return isolation.Errorf(isolation.ReasonStart, "pod %s/%s did not run berth-agent within %s: %s%s", s.ns, s.name, limit, pendingWhy(last), b.claimWhy(ctx, p))
	}
	return err
}

var errStartTimeout = errors.New("the pod's start took too long")

// started says whether the agent container runs, or why it never will.
func started(pod *corev1.Pod, p isolation.Plan) (bool, error) {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != agentContainer {
			continue
		}
		if cs.State.Running != nil {
			return true, nil
		}
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				return false, isolation.Errorf(isolation.ReasonImageUnavailable, "image %q cannot be had by node %s (%s: %s): load it into the nodes' runtime (imagePullPolicy %s) or push it to a registry they pull from",
					p.Kube.Image, pod.Spec.NodeName, w.Reason, w.Message, pod.Spec.Containers[0].ImagePullPolicy)
			case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return false, isolation.Errorf(isolation.ReasonStart, "the node refused the pod's container (%s: %s)", w.Reason, w.Message)
			}
		}
		if t := cs.State.Terminated; t != nil {
			return false, isolation.Errorf(isolation.ReasonCrashed, "berth-agent ended before it got its request (exit %d, %s: %s)", t.ExitCode, t.Reason, t.Message)
		}
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return false, isolation.Errorf(isolation.ReasonStart, "the pod ended before berth-agent ran (%s: %s)", pod.Status.Reason, pod.Status.Message)
	}
	return false, nil
}

// pendingWhy says why a pod is not running yet.
func pendingWhy(pod *corev1.Pod) string {
	if pod == nil {
		return "the API server never reported it"
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("it could not be scheduled (%s: %s); check [kubernetes] node_selector, tolerations and the plan's requests against the nodes", c.Reason, c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf("its container is waiting (%s: %s)", w.Reason, w.Message)
		}
	}
	return fmt.Sprintf("it is %s", pod.Status.Phase)
}

// errGone is a pod that was deleted under a run.
var errGone = errors.New("the pod is gone")

// watchPod reads a pod until cond says done (or fails), re-listing when a
// watch ends. It fails with ReasonClusterUnavailable once every call failed
// for b.unreachable, and with errGone when the pod is deleted.
func (b *Backend) watchPod(ctx context.Context, ns, name string, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	var failingSince time.Time
	failed := func(err error) error {
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		if time.Since(failingSince) >= b.unreachable {
			return &isolation.RunError{Reason: isolation.ReasonClusterUnavailable, Detail: fmt.Sprintf("lost the API server at %s for %s while following pod %s/%s", b.rest.Host, b.unreachable, ns, name), Err: err}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(500 * time.Millisecond):
		}
		return nil
	}
	pods := b.cs.CoreV1().Pods(ns)
	for {
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		getCtx, cancel := b.call(ctx)
		pod, err := pods.Get(getCtx, name, metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			return nil, errGone
		}
		if err != nil {
			if ferr := failed(err); ferr != nil {
				return nil, ferr
			}
			continue
		}
		failingSince = time.Time{}
		if done, err := cond(pod); done || err != nil {
			return pod, err
		}
		watchCtx, cancel := context.WithTimeout(ctx, watchWindow+b.apiTimeout)
		w, err := pods.Watch(watchCtx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: pod.ResourceVersion, TimeoutSeconds: ptr(int64(watchWindow / time.Second)),
		})
		if err != nil {
			cancel()
			if ferr := failed(err); ferr != nil {
				return nil, ferr
			}
			continue
		}
		pod, done, err := consume(w, cond)
		w.Stop()
		cancel()
		if done || err != nil {
			return pod, err
		}
	}
}

// consume reads a watch until cond is done, the pod is deleted or the
// watch ends (done false, err nil: look again).
func consume(w watch.Interface, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, bool, error) {
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Deleted:
			return nil, true, errGone
		case watch.Added, watch.Modified:
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if done, err := cond(pod); done || err != nil {
				return pod, true, err
			}
		case watch.Error:
			return nil, false, nil
		}
	}
	return nil, false, nil
}

// deletePod deletes a pod at once; gone is not an error.
func (b *Backend) deletePod(ns, name string) error {
	ctx, cancel := b.call(context.Background())
	defer cancel()
	err := b.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("cannot delete pod %s/%s: %w", ns, name, err)
}

// session is one pod serving (or waiting to serve) a run.
type session struct {
	b        *Backend
	ns, name string
	runID    string
	hash     string // warm members: the config hash they were made with

	streamCtx  context.Context
	stopStream context.CancelFunc
	copied     chan struct{} // closed when the attach stream ended
	attachErr  error         // set before copied closes
	released   sync.Once
	killed     atomic.Bool // Kill deleted the pod: its deletion is no fault
	agentEnded atomic.Bool // Wait saw the agent container end
	hold       *filesHold  // the reply's files are read before the pod goes (files.go)
	// filesIn is the container files are moved in and out through: the
	// files container, or a kept pod's agent container (files.go).
	filesIn string
}

func newSession(b *Backend, ns, name string) *session {
	ctx, cancel := context.WithCancel(context.Background())
	return &session{b: b, ns: ns, name: name, streamCtx: ctx, stopStream: cancel, copied: make(chan struct{})}
}

// attach hands the pod's agent its request on stdin (closing it after)
// and copies its stdout and stderr to the run's writers.
func (s *session) attach(input []byte, stdout, stderr io.Writer) {
	go func() {
		defer close(s.copied)
		exec, err := s.b.executor(s.ns, s.name)
		if err == nil {
			err = exec.StreamWithContext(s.streamCtx, remotecommand.StreamOptions{Stdin: bytes.NewReader(input), Stdout: stdout, Stderr: stderr})
		}
		if err != nil && s.streamCtx.Err() == nil {
			s.attachErr = err
		}
	}()
}

// executor is a pods/attach stream of the pod's agent container:
// WebSocket, falling back to SPDY for an API server without it.
func (b *Backend) executor(ns, name string) (remotecommand.Executor, error) {
	exec, err := b.streamer(ns, name, "attach", &corev1.PodAttachOptions{Container: agentContainer, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, fmt.Errorf("cannot attach to pod %s/%s: %w", ns, name, err)
	}
	return exec, nil
}

// streamer is the executor of a pod's attach or exec subresource with
// opts: WebSocket, falling back to SPDY where the API server or a proxy
// cannot upgrade.
func (b *Backend) streamer(ns, name, subresource string, opts runtime.Object) (remotecommand.Executor, error) {
	req := b.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource(subresource).
		VersionedParams(opts, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(b.rest, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(b.rest, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// attachFailed is why the attach stream failed, once it ended.
func (s *session) attachFailed() error {
	select {
	case <-s.copied:
		return s.attachErr
	default:
		return nil
	}
}

func (s *session) Handle() string { return handlePrefix + s.ns + "/" + s.name }

// Wait follows the pod until its agent container ended.
func (s *session) Wait(ctx context.Context) (isolation.Exit, error) {
	var exit isolation.Exit
	var stop = func(pod *corev1.Pod) (bool, error) {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == agentContainer && t != nil {
				exit = isolation.Exit{Code: int(t.ExitCode), OOM: t.Reason == "OOMKilled"}
				s.agentEnded.Store(true)
				return true, nil
			}
		}
		if pod.Status.Phase == corev1.PodFailed {
			switch pod.Status.Reason {
			case "DeadlineExceeded":
				exit = isolation.Exit{Code: -1, RuntimeLimit: true}
				return true, nil
			case "Evicted":
				return false, isolation.Errorf(isolation.ReasonCrashed, "the pod was evicted from node %s: %s", pod.Spec.NodeName, pod.Status.Message)
			}
			return false, isolation.Errorf(isolation.ReasonCrashed, "the pod failed (%s: %s)", pod.Status.Reason, pod.Status.Message)
		}
		if pod.DeletionTimestamp != nil {
			return false, isolation.Errorf(isolation.ReasonCrashed, "the pod is being deleted (its node %s was lost, or someone deleted it)", pod.Spec.NodeName)
		}
		return false, nil
	}
	// An attach that failed leaves the agent waiting for a request that
	// never comes: the run ends now, not at its timeout.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.copied:
			if s.attachErr != nil {
				cancel(s.attachErr)
			}
		case <-ctx.Done():
		}
	}()
	_, err := s.b.watchPod(ctx, s.ns, s.name, stop)
	if err != nil && s.killed.Load() {
		return isolation.Exit{Code: -1, Signal: syscall.SIGKILL}, nil // ended by Supervise's kill
	}
	if aerr := s.attachFailed(); err != nil && aerr != nil && errors.Is(context.Cause(ctx), aerr) {
		return isolation.Exit{Code: -1}, &isolation.RunError{Reason: isolation.ReasonStart, Detail: fmt.Sprintf("cannot attach to pod %s/%s to hand berth-agent its request", s.ns, s.name), Err: aerr}
	}
	if errors.Is(err, errGone) {
		return isolation.Exit{Code: -1}, isolation.Errorf(isolation.ReasonCrashed, "pod %s/%s was deleted under the run (its node was lost, or someone deleted it)", s.ns, s.name)
	}
	if err != nil {
		if ctx.Err() != nil {
			return isolation.Exit{Code: -1}, &isolation.RunError{Reason: isolation.ReasonClusterUnavailable, Detail: "the pod did not end", Err: err}
		}
		return isolation.Exit{Code: -1}, err
	}
	return exit, nil
}

// Kill deletes the pod now.
func (s *session) Kill(ctx context.Context) error {
	if s.heldAfterExit() {
		return nil // Release deletes it once the reply's files are read
	}
	s.killed.Store(true)
	return s.b.deletePod(s.ns, s.name)
}

func (s *session) Drained() <-chan struct{} { return s.copied }

// Inspect asks whether the kernel OOM-killed the agent container.
func (s *session) Inspect(ctx context.Context, suspect bool) bool {
	ctx, cancel := s.b.call(ctx)
	defer cancel()
	pod, err := s.b.cs.CoreV1().Pods(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Reason == "OOMKilled" {
			return true
		}
	}
	return false
}

// Release ends the attach stream and deletes the pod in the background
// (Drain waits for it; a crash leaves it to Sweep).
func (s *session) Release() {
	s.released.Do(func() {
		s.stopStream()
		s.b.own(s.name)
		s.b.removals.Go(func() {
			s.waitFiles()
			if err := s.b.deletePod(s.ns, s.name); err != nil {
				s.b.log.Error("cannot delete a run's pod; the next scheduler start removes it", "pod", s.name, "err", err)
			}
			s.b.disown(s.name)
		})
	})
}

// endingLater lets an answered run return before its pod is deleted.
type endingLater struct{ *session }

var _ isolation.BackgroundEnder = endingLater{}

func (s endingLater) EndsInBackground(teardown func() error) {
	s.b.own(s.name)
	s.b.removals.Go(func() {
		s.waitFiles()
		if err := teardown(); err != nil {
			s.b.log.Warn("the pod of an answered run did not end cleanly", "run_id", s.runID, "pod", s.name, "err", err)
		}
	})
}

func (b *Backend) own(name string) {
	b.mu.Lock()
	b.owned[name] = true
	b.mu.Unlock()
}

func (b *Backend) disown(name string) {
	b.mu.Lock()
	delete(b.owned, name)
	b.mu.Unlock()
}

func (b *Backend) owns(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.owned[name]
}

// Kill deletes the pod named by a handle OnStart reported; a pod that is
// gone is not an error.
func (b *Backend) Kill(ctx context.Context, handle string) error {
	rest, ok := strings.CutPrefix(handle, handlePrefix)
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns == "" || name == "" {
		return fmt.Errorf("cannot parse handle %q: want %s<namespace>/<pod>", handle, handlePrefix)
	}
	return b.killOwn(ctx, ns, name) // hosts.go: never another host's pod
}

// Sweep deletes this instance's pods whose run and attempt live does not
// claim (warm pods of an earlier process included) and returns the runs
// it cleaned up.
func (b *Backend) Sweep(ctx context.Context, live func(runID string, attempt int) bool) ([]string, error) {
	b.mu.Lock()
	var namespaces []string
	for ns := range b.namespaces {
		namespaces = append(namespaces, ns)
	}
	b.mu.Unlock()
	var removed []string
	var errs []error
	for _, ns := range namespaces {
		listCtx, cancel := b.call(ctx)
		list, err := b.cs.CoreV1().Pods(ns).List(listCtx, metav1.ListOptions{LabelSelector: b.ownSelector()})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot list the pods of namespace %s: %w", ns, err))
			continue
		}
		for _, pod := range list.Items {
			if b.owns(pod.Name) {
				continue
			}
			run, isRun := pod.Labels[LabelRun]
			if isRun {
				attempt, _ := strconv.Atoi(pod.Labels[LabelAttempt])
				if live != nil && live(run, attempt) {
					continue
				}
			}
			if err := b.deletePod(ns, pod.Name); err != nil {
				errs = append(errs, err)
				continue
			}
			if isRun {
				removed = append(removed, run)
			} else {
				b.log.Info("removed a pod left behind by an earlier scheduler", "pod", pod.Name, "agent", pod.Labels[LabelPool])
			}
		}
	}
	return removed, errors.Join(errs...)
}

// Explain says how a plan's pod is confined, for `berthctl sandbox explain`.
func (b *Backend) Explain(p isolation.Plan) isolation.Confinement {
	c := Explain(p, b.apiTimeout)
	if l := b.explainLease(p); l != "" {
		c.Holds = append(c.Holds, l)
	}
	return c
}

// Explain is Backend.Explain for an API deadline.
func Explain(p isolation.Plan, apiTimeout time.Duration) isolation.Confinement {
	l, k := p.Limits, p.Kube
	c := isolation.Confinement{Mode: "kubernetes pod"}
	limit := func(set bool, holds, missing string) {
		if set {
			c.Holds = append(c.Holds, holds)
		} else {
			c.Missing = append(c.Missing, missing+", so its runs are refused")
		}
	}
	limit(l.MemoryBytes > 0, fmt.Sprintf("memory request = limit = %s (an OOM kill fails the run with %q)", isolation.FormatBytes(l.MemoryBytes), isolation.ReasonOutOfMemory), "memory: the plan has no memory limit")
	limit(l.NanoCPUs > 0, fmt.Sprintf("cpu request = limit = %dm", l.NanoCPUs/1_000_000), "cpu: the plan has no CPU limit")
	limit(l.TmpfsBytes > 0, fmt.Sprintf("readOnlyRootFilesystem; %s a memory emptyDir of %s", isolation.ContainerTmp, isolation.FormatBytes(l.TmpfsBytes)), "/tmp: the plan gives it no size")
	c.Holds = append(c.Holds,
		"runAsNonRoot with the plan's uid, allowPrivilegeEscalation false, capabilities drop ALL, seccomp RuntimeDefault",
		"automountServiceAccountToken false, no service links: the pod holds no credential of the cluster",
		"the request (and any key) only on the agent's stdin over pods/attach: never in the pod's spec, env, args, labels or annotations",
		fmt.Sprintf("every API call has a deadline of %s; the pod is deleted after the run, and activeDeadlineSeconds ends it if berth cannot", apiTimeout))
	c.Missing = append(c.Missing,
		fmt.Sprintf("a per-pod process limit: Kubernetes has none (the kubelet's podPidsLimit is per node); the plan's %d is not enforced", l.Pids))
	if usesClaim(p) {
		class := "the cluster's default storage class"
		if k.StorageClass != "" {
			class = "storage class " + k.StorageClass
		}
		c.Holds = append(c.Holds, fmt.Sprintf("%s is the agent's own PersistentVolumeClaim %s (%s, %s, %s; created if missing, never deleted by berth): it persists between runs, and no other agent's pod mounts it", isolation.ContainerWorkspace, ClaimName(p.AgentID), class, isolation.FormatBytes(workspaceSize(p)), accessMode(p)))
	} else {
		c.Missing = append(c.Missing, fmt.Sprintf("a persistent workspace: %s is an emptyDir that ends with the pod ([kubernetes] workspace = \"pvc\" keeps it)", isolation.ContainerWorkspace))
	}
	switch k.EgressVerifiedBy {
	case "admin":
		c.Holds = append(c.Holds, "no way out but berth's egress router: a NetworkPolicy per namespace allows only "+orNone(k.ProxyAddr)+", enforced by the cluster's CNI as the admin vouched ([kubernetes] egress_verified_by = \"admin\")")
	default:
		c.Holds = append(c.Holds, "no way out but berth's egress router: a NetworkPolicy per namespace allows only "+orNone(k.ProxyAddr)+", and before the first run a probe pod must fail to reach the API server and the host directly while the router answers; every run fails closed otherwise")
	}
	if p.Egress != nil {
		c.Holds = append(c.Holds, "the egress router on "+k.ProxyAddr+" hands each connection to the run's own egress proxy by its token (Proxy-Authorization); no provider key in the pod")
	}
	if usesCA(p) {
		c.Holds = append(c.Holds, "the run's egress CA certificate (never its key, which stays with berth-egress on the berth host) in a ConfigMap owned by the pod, mounted read-only at "+p.Egress.SandboxCABundle)
	}
	if k.RuntimeClass == "" {
		c.Missing = append(c.Missing, "a sandboxing runtime: the pod shares its node's kernel ([kubernetes] runtime_class unset)")
	} else {
		c.Holds = append(c.Holds, "runtimeClassName "+k.RuntimeClass)
	}
	return c
}

func orNone(addr string) string {
	if addr == "" {
		return "nothing (no egress router configured)"
	}
	return addr
}
