package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation"
)

// LabelHost is the berth host that created a pod ([kubernetes] host_id,
// ADR 28): Sweep and Kill touch only pods with this host's value, so
// berth hosts that share a cluster (and even a namespace and a state
// directory path) never remove each other's pods.
const LabelHost = "berth.host"

// MachineIDFile is where HostID reads the default host identity.
var MachineIDFile = "/etc/machine-id"

// HostID is the host identity of [kubernetes] host_id: configured when
// set, else this machine's /etc/machine-id. It fails when neither gives
// one, rather than let two hosts share an empty identity.
func HostID(configured string) (string, error) {
	if configured != "" {
		if v := labelValue(configured); v != configured {
			return "", fmt.Errorf("[kubernetes] host_id %q is not a Kubernetes label value", configured)
		}
		return configured, nil
	}
	data, err := os.ReadFile(MachineIDFile)
	if err != nil {
		return "", fmt.Errorf("no host identity: [kubernetes] host_id is unset and %w; set host_id to a name unique among the berth hosts sharing the cluster", err)
	}
	id := labelValue(strings.TrimSpace(string(data)))
	if id == "" {
		return "", fmt.Errorf("no host identity: [kubernetes] host_id is unset and %s is empty; set host_id to a name unique among the berth hosts sharing the cluster", MachineIDFile)
	}
	return id, nil
}

// instanceOf is the berth.instance value of a scheduler: its state
// directory, and its host when it has one, so that two hosts with the same
// state directory path get different NetworkPolicies and sweeps.
func instanceOf(host, instance string) string {
	if host == "" {
		return InstanceLabel(instance)
	}
	return InstanceLabel(host + "\x00" + instance)
}

// HostLabel is the berth.host value of the backend's pods ("" when it was
// made without a host identity).
func (b *Backend) HostLabel() string { return b.host }

// Identity is how the backend names itself as a lease holder: its host
// and its instance.
func (b *Backend) Identity() string {
	if b.host == "" {
		return "instance " + b.instance
	}
	return b.host + "/" + b.instance
}

// podFor is PodFor with this host's label.
func (b *Backend) podFor(p isolation.Plan) (*corev1.Pod, string, error) {
	pod, hash, err := PodFor(p, b.instance)
	if err == nil && b.host != "" {
		pod.Labels[LabelHost] = b.host
	}
	return pod, hash, err
}

// ownSelector selects the pods of this backend: its instance and, when it
// has one, its host.
func (b *Backend) ownSelector() string {
	sel := LabelInstance + "=" + b.instance
	if b.host != "" {
		sel += "," + LabelHost + "=" + b.host
	}
	return sel
}

// errNotOurs is a pod of another berth host or instance.
var errNotOurs = errors.New("the pod belongs to another berth host")

// killOwn deletes a pod if it is this backend's; gone is not an error. A
// handle of another host's pod (a record copied between hosts, a typo in
// `berthctl`) is refused, not obeyed.
func (b *Backend) killOwn(ctx context.Context, ns, name string) error {
	getCtx, cancel := b.call(ctx)
	pod, err := b.cs.CoreV1().Pods(ns).Get(getCtx, name, metav1.GetOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read pod %s/%s before deleting it: %w", ns, name, err)
	}
	if pod.Labels[LabelInstance] != b.instance || b.host != "" && pod.Labels[LabelHost] != b.host {
		return fmt.Errorf("will not delete pod %s/%s (berth.host %q, berth.instance %q; this is %s): %w",
			ns, name, pod.Labels[LabelHost], pod.Labels[LabelInstance], b.Identity(), errNotOurs)
	}
	return b.deletePod(ns, name)
}
