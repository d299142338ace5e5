package isolation

// KubePlan is what only the kubernetes backend reads: where and how a run's
// pod is placed ([kubernetes] in berth.toml, ADR 22). It holds no secret.
type KubePlan struct {
	// Namespace the run's pod (and its egress NetworkPolicy) lives in.
	Namespace string `json:"namespace,omitempty"`
	// Image is the pod's image (the agent's isolation image); it must be
	// on the nodes or in a registry they pull from.
	Image string `json:"image,omitempty"`
	// ImagePullPolicy is the pod's imagePullPolicy: Never, IfNotPresent or
	// Always.
	ImagePullPolicy string `json:"image_pull_policy,omitempty"`
	// RuntimeClass is the pod's runtimeClassName ("" is the cluster's
	// default runtime).
	RuntimeClass string            `json:"runtime_class,omitempty"`
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	Tolerations  []KubeToleration  `json:"tolerations,omitempty"`
	// ServiceAccount is the pod's service account; its token is never
	// mounted either way.
	ServiceAccount string `json:"service_account,omitempty"`
	// ProxyAddr is the host:port of berth's egress router that pods reach
	// (the only address the run's NetworkPolicy lets them reach); "" when
	// the run has no egress.
	ProxyAddr string `json:"proxy_addr,omitempty"`
	// EgressVerifiedBy says how berth knows pods have no other way out:
	// "probe" (a pod tries direct connections before the first run and
	// every run fails closed if one succeeds) or "admin" (the admin vouches
	// that the cluster enforces NetworkPolicy).
	EgressVerifiedBy string `json:"egress_verified_by,omitempty"`
	// Warm is how many started pods wait for this agent's requests.
	Warm int `json:"warm,omitempty"`
	// Workspace is where the pod's /workspace lives: "" an emptyDir that
	// ends with the pod, KubeWorkspacePVC the agent's own
	// PersistentVolumeClaim, created if missing and never deleted by berth
	// (ADR 29).
	Workspace string `json:"workspace,omitempty"`
	// StorageClass is the claim's storageClassName ("" the cluster's
	// default class); WorkspaceSize its request in bytes; AccessMode its
	// access mode (ReadWriteOnce unless set).
	StorageClass  string `json:"storage_class,omitempty"`
	WorkspaceSize int64  `json:"workspace_size,omitempty"`
	AccessMode    string `json:"access_mode,omitempty"`
}

// KubeWorkspacePVC is KubePlan.Workspace for a PersistentVolumeClaim per agent.
const KubeWorkspacePVC = "pvc"

// KubeToleration is one toleration of a run's pod.
type KubeToleration struct {
	Key      string `json:"key,omitempty"`
	Operator string `json:"operator,omitempty"`
	Value    string `json:"value,omitempty"`
	Effect   string `json:"effect,omitempty"`
}

// KubeEgressSocketPrefix marks an Egress.Socket that is a TCP address
// ("tcp:10.88.0.1:3129"): berth-agent in a pod dials berth's egress router
// there instead of a Unix socket.
const KubeEgressSocketPrefix = "tcp:"
