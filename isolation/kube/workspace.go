package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation"
)

// The workspace of a pod (ADR 29). By default /workspace is an emptyDir
// that ends with the pod. With [kubernetes] workspace = "pvc" every agent
// has one PersistentVolumeClaim of its own, named by ClaimName, created the
// first time a pod of the agent needs it and never deleted by berth (Sweep
// deletes pods only): what a run writes to /workspace is there for the
// agent's next run, and only for it, since each pod mounts its own
// agent's claim and nothing else.

// LabelWorkspace marks a workspace claim berth created; its berth.agent is
// the agent's.
const LabelWorkspace = "berth.workspace"

// DefaultWorkspaceSize is a claim's request when neither the plan nor the
// agent's workspace quota sets one.
const DefaultWorkspaceSize = 1 << 30

// ClaimName is the PersistentVolumeClaim of an agent's workspace: a name
// Kubernetes accepts, distinct for distinct agent ids (a hash of the id
// ends it, so "a.b" and "a_b" get two claims).
func ClaimName(agentID string) string {
	sum := sha256.Sum256([]byte(agentID))
	name := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			return c
		case c >= 'A' && c <= 'Z':
			return c + 'a' - 'A'
		}
		return '-'
	}, agentID)
	name = strings.Trim(name[:min(len(name), 40)], "-")
	if name == "" {
		return "berth-ws-" + hex.EncodeToString(sum[:6])
	}
	return "berth-ws-" + name + "-" + hex.EncodeToString(sum[:6])
}

// usesClaim says whether the plan's workspace is the agent's claim.
func usesClaim(p isolation.Plan) bool { return p.Kube.Workspace == isolation.KubeWorkspacePVC }

// workspaceSize is the claim's request.
func workspaceSize(p isolation.Plan) int64 {
	switch {
	case p.Kube.WorkspaceSize > 0:
		return p.Kube.WorkspaceSize
	case p.Limits.WorkspaceBytes > 0:
		return p.Limits.WorkspaceBytes
	}
	return DefaultWorkspaceSize
}

// accessMode is the claim's access mode.
func accessMode(p isolation.Plan) corev1.PersistentVolumeAccessMode {
	if p.Kube.AccessMode == "" {
		return corev1.ReadWriteOnce
	}
	return corev1.PersistentVolumeAccessMode(p.Kube.AccessMode)
}

// workspaceVolume is the pod's workspace volume: the agent's claim, or an
// emptyDir of the plan's workspace size.
func workspaceVolume(p isolation.Plan) corev1.VolumeSource {
	if usesClaim(p) {
		return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(p.AgentID)}}
	}
	ws := &corev1.EmptyDirVolumeSource{}
	if p.Limits.WorkspaceBytes > 0 {
		ws.SizeLimit = resource.NewQuantity(p.Limits.WorkspaceBytes, resource.BinarySI)
	}
	return corev1.VolumeSource{EmptyDir: ws}
}

// ClaimFor is the claim berth creates for a plan's agent when it has none.
func ClaimFor(p isolation.Plan, instance string) *corev1.PersistentVolumeClaim {
	var class *string
	if p.Kube.StorageClass != "" {
		class = ptr(p.Kube.StorageClass)
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: ClaimName(p.AgentID), Namespace: p.Kube.Namespace,
			Labels: map[string]string{LabelWorkspace: "1", LabelAgent: labelValue(p.AgentID), LabelInstance: instance},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{accessMode(p)},
			StorageClassName: class,
			VolumeMode:       ptr(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(workspaceSize(p), resource.BinarySI),
			}},
		},
	}
}

// ensureClaim makes sure the agent's workspace claim exists, creating it
// when it does not. A claim of that name that berth labelled for another
// agent is refused rather than shared. It does not wait for the claim to
// bind: with a WaitForFirstConsumer class that happens only once the pod
// is scheduled, and a claim that never binds fails the run at its start
// timeout, saying so (claimWhy).
func (b *Backend) ensureClaim(ctx context.Context, p isolation.Plan) error {
	if !usesClaim(p) {
		return nil
	}
	ns, name := p.Kube.Namespace, ClaimName(p.AgentID)
	key := ns + "/" + name
	b.mu.Lock()
	known := b.claims[key]
	b.mu.Unlock()
	if known {
		return nil
	}
	claims := b.cs.CoreV1().PersistentVolumeClaims(ns)
	getCtx, cancel := b.call(ctx)
	pvc, err := claims.Get(getCtx, name, metav1.GetOptions{})
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		createCtx, cancel := b.call(context.WithoutCancel(ctx))
		_, err = claims.Create(createCtx, ClaimFor(p, b.instance), metav1.CreateOptions{})
		cancel()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return b.apiError(fmt.Sprintf("create the workspace claim %s/%s of agent %s", ns, name, p.AgentID), err)
		}
		b.log.Info("created the agent's workspace claim; berth never deletes it", "agent", p.AgentID, "claim", key, "storage_class", p.Kube.StorageClass, "size", isolation.FormatBytes(workspaceSize(p)))
	case err != nil:
		return b.apiError(fmt.Sprintf("read the workspace claim %s/%s of agent %s", ns, name, p.AgentID), err)
	default:
		if owner, ok := pvc.Labels[LabelAgent]; ok && owner != labelValue(p.AgentID) {
			return isolation.Errorf(isolation.ReasonStart, "workspace claim %s is labelled for agent %q, not %q: berth does not share a workspace between agents; delete or relabel the claim", key, owner, p.AgentID)
		}
	}
	b.mu.Lock()
	b.claims[key] = true
	b.mu.Unlock()
	return nil
}

// claimWhy says why the agent's claim keeps its pod from running, or "".
func (b *Backend) claimWhy(ctx context.Context, p isolation.Plan) string {
	if !usesClaim(p) {
		return ""
	}
	ns, name := p.Kube.Namespace, ClaimName(p.AgentID)
	ctx, cancel := b.call(context.WithoutCancel(ctx))
	defer cancel()
	pvc, err := b.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("; its workspace claim %s/%s cannot be read: %v", ns, name, err)
	}
	if pvc.Status.Phase == corev1.ClaimBound {
		return ""
	}
	class := "the cluster's default class"
	if pvc.Spec.StorageClassName != nil {
		class = "storage class " + *pvc.Spec.StorageClassName
	}
	why := fmt.Sprintf("; its workspace claim %s/%s is %s, not bound: %s provided no volume of %s %s", ns, name, orPending(pvc.Status.Phase), class, pvc.Spec.Resources.Requests.Storage(), modes(pvc.Spec.AccessModes))
	events, err := b.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + name})
	if err == nil && len(events.Items) > 0 {
		last := events.Items[len(events.Items)-1]
		why += fmt.Sprintf(" (%s: %s)", last.Reason, last.Message)
	}
	return why + "; check [kubernetes] storage_class, workspace_size and workspace_access_mode against the cluster's provisioners"
}

func orPending(phase corev1.PersistentVolumeClaimPhase) string {
	if phase == "" {
		return string(corev1.ClaimPending)
	}
	return string(phase)
}

func modes(ms []corev1.PersistentVolumeAccessMode) string {
	var s []string
	for _, m := range ms {
		s = append(s, string(m))
	}
	return strings.Join(s, ",")
}
