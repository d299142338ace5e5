package config

import (
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
)

// Backends an agent's backend key names: "local" (the default: this host's
// backends, as container_mode and file_access choose) or "kubernetes" (a
// pod per run in the [kubernetes] cluster).
const (
	BackendLocal      = "local"
	BackendKubernetes = "kubernetes"
)

// How berth knows pods have no way out but its egress router.
const (
	EgressVerifiedByProbe = "probe" // a probe pod before the first run (the default)
	EgressVerifiedByAdmin = "admin" // the admin vouches the cluster enforces NetworkPolicy
)

// DefaultKubeNamespace is the namespace of berth's pods when none is set.
const DefaultKubeNamespace = "berth"

// Kubernetes is [kubernetes]: the cluster the agents with backend =
// "kubernetes" run in (ADR 22). It is kept as written; its methods give the
// defaults of what no file set.
type Kubernetes struct {
	// Kubeconfig is the client config file; "" is the in-cluster config
	// (berth-scheduler itself running in a pod).
	Kubeconfig string `toml:"kubeconfig" berth:"check=absolutePath"`
	// Namespace of the pods (default DefaultKubeNamespace); it must exist.
	Namespace    string            `toml:"namespace" berth:"check=kubeName"`
	RuntimeClass string            `toml:"runtime_class" berth:"check=kubeName"`
	NodeSelector map[string]string `toml:"node_selector"` // checked by kubernetesMerged: label keys and values
	Tolerations  []KubeToleration  `toml:"tolerations"`
	// ImagePullPolicy is the pods' imagePullPolicy (default IfNotPresent).
	ImagePullPolicy string `toml:"image_pull_policy" berth:"check=kubePullPolicy"`
	// ServiceAccount is the pods' service account (default: the
	// namespace's default one); its token is never mounted.
	ServiceAccount string `toml:"service_account" berth:"check=kubeName"`
	// Warm is how many started pods wait for each kubernetes agent's
	// requests (runs with egress always get a fresh pod).
	Warm *int `toml:"warm" berth:"check=warm"`
	// ProxyListen is the IP:port of berth's egress router on this host, as
	// the cluster's pods reach it (the CNI bridge's host address on a
	// single node); required when an agent uses kubernetes.
	ProxyListen string `toml:"proxy_listen" berth:"check=kubeProxyListen"`
	// EgressVerifiedBy is EgressVerifiedByProbe (default) or
	// EgressVerifiedByAdmin.
	EgressVerifiedBy string `toml:"egress_verified_by" berth:"check=kubeEgressVerifiedBy"`
	// HostID names this berth host among those sharing the cluster
	// (ADR 28): its pods carry it as the berth.host label, its sweep and
	// kills touch only pods with it, and it is the holder of the agents'
	// leases. "" is /etc/machine-id.
	HostID string `toml:"host_id" berth:"check=kubeHostID"`
	// Workspace is where a pod's /workspace lives: KubeWorkspaceEmptyDir
	// (the default: it ends with the pod) or KubeWorkspacePVC (a
	// PersistentVolumeClaim per agent, created if missing, never deleted
	// by berth; ADR 29).
	Workspace string `toml:"workspace" berth:"check=kubeWorkspace"`
	// StorageClass is the claims' storageClassName ("" the cluster's
	// default class).
	StorageClass string `toml:"storage_class" berth:"check=kubeSubdomain"`
	// WorkspaceSize is a new claim's request (default: the agent's
	// workspace_quota, 1g if that is 0).
	WorkspaceSize *Bytes `toml:"workspace_size" berth:"check=workspaceQuota"`
	// WorkspaceAccessMode is a new claim's access mode (default
	// ReadWriteOnce: the pods of one agent then share a node).
	WorkspaceAccessMode string `toml:"workspace_access_mode" berth:"check=kubeAccessMode"`
}

// Where a kubernetes pod's /workspace lives ([kubernetes] workspace).
const (
	KubeWorkspaceEmptyDir = "emptydir"
	KubeWorkspacePVC      = "pvc"
)

// WorkspaceMode is Workspace, defaulted.
func (k Kubernetes) WorkspaceMode() string { return first(k.Workspace, KubeWorkspaceEmptyDir) }

// AccessMode is WorkspaceAccessMode, defaulted.
func (k Kubernetes) AccessMode() string { return first(k.WorkspaceAccessMode, "ReadWriteOnce") }

// ClaimSize is WorkspaceSize, defaulted to quota (the agent's
// workspace_quota), or 1g when that is 0.
func (k Kubernetes) ClaimSize(quota Bytes) Bytes {
	if k.WorkspaceSize != nil && *k.WorkspaceSize > 0 {
		return *k.WorkspaceSize
	}
	if quota > 0 {
		return quota
	}
	return 1 << 30
}

// KubeToleration is one [[kubernetes.tolerations]].
type KubeToleration struct {
	Key      string `toml:"key"`
	Operator string `toml:"operator" berth:"check=kubeTolerationOperator"`
	Value    string `toml:"value"`
	Effect   string `toml:"effect" berth:"check=kubeTaintEffect"`
}

// Namespaced is Namespace, defaulted.
func (k Kubernetes) Namespaced() string { return first(k.Namespace, DefaultKubeNamespace) }

// PullPolicy is ImagePullPolicy, defaulted.
func (k Kubernetes) PullPolicy() string { return first(k.ImagePullPolicy, "IfNotPresent") }

// VerifiedBy is EgressVerifiedBy, defaulted.
func (k Kubernetes) VerifiedBy() string { return first(k.EgressVerifiedBy, EgressVerifiedByProbe) }

// WarmPods is Warm, defaulted (none).
func (k Kubernetes) WarmPods() int { return firstSet(0, k.Warm) }

var (
	kubeNamePattern  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	kubeLabelKey     = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	kubeSubdomain    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	kubeLabelValue   = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	kubernetesChecks = map[string]any{
		"backend": oneOf(BackendLocal, BackendKubernetes),
		"kubeName": func(s string) string {
			if !kubeNamePattern.MatchString(s) {
				return fmt.Sprintf("%q is not a Kubernetes name: 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit", s)
			}
			return ""
		},
		"kubeHostID": func(s string) string {
			if s == "" || !kubeLabelValue.MatchString(s) {
				return fmt.Sprintf("%q is not a Kubernetes label value: 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", s)
			}
			return ""
		},
		"kubeSubdomain": func(s string) string {
			if !kubeSubdomain.MatchString(s) {
				return fmt.Sprintf("%q is not a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit", s)
			}
			return ""
		},
		"kubeWorkspace":          oneOf(KubeWorkspaceEmptyDir, KubeWorkspacePVC),
		"kubeAccessMode":         oneOf("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"),
		"kubePullPolicy":         oneOf("Never", "IfNotPresent", "Always"),
		"kubeEgressVerifiedBy":   oneOf(EgressVerifiedByProbe, EgressVerifiedByAdmin),
		"kubeTolerationOperator": oneOf("Equal", "Exists"),
		"kubeTaintEffect":        oneOf("NoSchedule", "PreferNoSchedule", "NoExecute"),
		"kubeProxyListen": func(s string) string {
			host, port, err := net.SplitHostPort(s)
			if err != nil || port == "" || port == "0" {
				return fmt.Sprintf("%q is not an IP:port address", s)
			}
			ip := net.ParseIP(host)
			switch {
			case ip == nil:
				return fmt.Sprintf("%q: the host must be an IP address pods route to (a NetworkPolicy names it)", s)
			case ip.IsLoopback() || ip.IsUnspecified():
				return fmt.Sprintf("%q: a pod cannot reach the host's loopback, and the router must not listen on every address; use the address pods route to (the CNI bridge's host address)", s)
			}
			return ""
		},
	}
)

func init() { maps.Copy(valueChecks, kubernetesChecks) }

// usesKubernetes is the agents whose backend is "kubernetes".
func (t *tree) kubernetesAgents() []*entry[AgentSettings] {
	var out []*entry[AgentSettings]
	for _, a := range t.v.Agents {
		if first(a.v.Backend, t.v.AgentDefaults.v.Backend) == BackendKubernetes {
			out = append(out, a)
		}
	}
	return out
}

// kubernetesMerged checks what spans keys: node_selector's labels and the
// router's address every kubernetes agent needs.
func (t *tree) kubernetesMerged(c *checks) {
	k := &t.v.Kubernetes
	for _, key := range slices.Sorted(maps.Keys(k.NodeSelector)) {
		l := t.at["kubernetes.node_selector."+key]
		if l.line == 0 {
			l = t.at["kubernetes.node_selector"]
		}
		if !kubeLabelKey.MatchString(key) {
			c.fail(l, "%q is not a Kubernetes label key", key)
		}
		if v := k.NodeSelector[key]; !kubeLabelValue.MatchString(v) {
			c.fail(l, "%q is not a Kubernetes label value", v)
		}
	}
	agents := t.kubernetesAgents()
	if len(agents) == 0 {
		return
	}
	if k.ProxyListen == "" {
		a := agents[0]
		c.fail(where(a.at, a.self, "backend"), "agent %q runs on kubernetes, which needs [kubernetes] proxy_listen: the IP:port pods reach berth's egress router on", a.v.ID)
	}
}

// kubernetesWhy is the kubernetes settings of an agent for explanations.
func (k Kubernetes) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "namespace %s, imagePullPolicy %s", k.Namespaced(), k.PullPolicy())
	if k.RuntimeClass != "" {
		fmt.Fprintf(&b, ", runtimeClassName %s", k.RuntimeClass)
	}
	if len(k.NodeSelector) > 0 {
		fmt.Fprintf(&b, ", nodeSelector %v", k.NodeSelector)
	}
	if len(k.Tolerations) > 0 {
		fmt.Fprintf(&b, ", %d toleration(s)", len(k.Tolerations))
	}
	if k.ServiceAccount != "" {
		fmt.Fprintf(&b, ", service account %s (token not mounted)", k.ServiceAccount)
	}
	if k.WorkspaceMode() == KubeWorkspacePVC {
		fmt.Fprintf(&b, ", workspace a PersistentVolumeClaim per agent (%s, %s)", first(k.StorageClass, "the default storage class"), k.AccessMode())
	}
	return b.String()
}
