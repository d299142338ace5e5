package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation"
)

// The CA of a run's egress proxy in its pod. A run with [[egress.secrets]],
// git rules or read-only egress has its proxy intercept TLS with the run's
// own CA, which the tools must trust: the backend puts the CA's
// certificate (public; the key stays with berth-egress on the berth host)
// in a ConfigMap of the run's pod, mounted read-only at the plan's
// SandboxCABundle. The ConfigMap is owned by the pod, so the cluster's
// garbage collector deletes it with the pod, whoever deletes that.

// LabelCA marks a run's CA ConfigMap.
const LabelCA = "berth.ca"

const caVolume = "egress-ca"

// usesCA says whether the plan's pod needs the run's CA.
func usesCA(p isolation.Plan) bool {
	return p.Egress != nil && p.Egress.CABundle != "" && p.Egress.SandboxCABundle != ""
}

// CAConfigMapName is the ConfigMap of a run attempt's CA.
func CAConfigMapName(runID string, attempt int) string {
	sum := sha256.Sum256([]byte(isolation.AttemptName(runID, attempt)))
	return "berth-ca-" + hex.EncodeToString(sum[:10])
}

// caVolumeFor adds the CA's volume and mount to a pod of plan p.
func caVolumeFor(pod *corev1.Pod, p isolation.Plan) {
	if !usesCA(p) {
		return
	}
	dir, name := path.Split(p.Egress.SandboxCABundle)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: caVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: CAConfigMapName(p.RunID, p.Attempt)},
		Items:                []corev1.KeyToPath{{Key: isolation.EgressCABundleName, Path: name}},
		DefaultMode:          ptr(int32(0o444)),
	}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: caVolume, MountPath: path.Clean(dir), ReadOnly: true})
}

// CertificatesOnly returns the PEM certificates of a bundle, refusing one
// that holds anything else (a private key above all): only public
// certificates may reach a pod.
func CertificatesOnly(bundle []byte) ([]byte, error) {
	var out bytes.Buffer
	rest := bundle
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("the CA bundle holds a %q block; only certificates may reach a pod", block.Type)
		}
		if err := pem.Encode(&out, block); err != nil {
			return nil, err
		}
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("the CA bundle holds data that is not PEM")
	}
	if out.Len() == 0 {
		return nil, errors.New("the CA bundle holds no certificate")
	}
	return out.Bytes(), nil
}

// readCA is the certificates of the plan's CA bundle, nil when its pod
// needs none; read before the pod is made, so a bundle that holds a key
// fails the run with no pod.
func readCA(p isolation.Plan) ([]byte, error) {
	if !usesCA(p) {
		return nil, nil
	}
	data, err := os.ReadFile(p.Egress.CABundle)
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot read the run's egress CA", Err: err}
	}
	certs, err := CertificatesOnly(data)
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot hand the pod the run's egress CA " + p.Egress.CABundle, Err: err}
	}
	return certs, nil
}

// createCA creates the ConfigMap of a created pod's CA, owned by the pod.
// The kubelet waits for it before it starts the pod's container.
func (b *Backend) createCA(ctx context.Context, pod *corev1.Pod, p isolation.Plan, certs []byte) error {
	if certs == nil {
		return nil
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: CAConfigMapName(p.RunID, p.Attempt), Namespace: pod.Namespace,
			Labels:          map[string]string{LabelCA: "1", LabelRun: labelValue(p.RunID), LabelInstance: b.instance},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Data:      map[string]string{isolation.EgressCABundleName: string(certs)},
		Immutable: ptr(true),
	}
	createCtx, cancel := b.call(context.WithoutCancel(ctx))
	defer cancel()
	if _, err := b.cs.CoreV1().ConfigMaps(pod.Namespace).Create(createCtx, cm, metav1.CreateOptions{}); err != nil {
		return b.apiError(fmt.Sprintf("create the CA ConfigMap %s/%s of pod %s", pod.Namespace, cm.Name, pod.Name), err)
	}
	return nil
}
