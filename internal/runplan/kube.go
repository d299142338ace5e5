package runplan

import (
	"fmt"
	"maps"
	"net"
	"path"
	"slices"
	"strconv"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// kubePlan fills in what a kubernetes run gets (ADR 22): a pod in
// [kubernetes] namespace, hardened as a container is, with no network but
// the route to berth's egress router.
func kubePlan(c *compiled, cfg *config.Config, a config.Agent) {
	p := &c.plan
	k := cfg.Kubernetes
	p.SandboxWorkspace = isolation.ContainerWorkspace
	p.Network = isolation.Network{Allowed: false, Mode: "none"}
	p.Policy = isolation.ContainerPolicy(false)
	p.Limits.TmpfsBytes = DefaultTmpfs
	image := a.Container.Image
	if image == "" && a.Image.Image != "" {
		image = a.Image.Image
	}
	var tolerations []isolation.KubeToleration
	for _, t := range k.Tolerations {
		tolerations = append(tolerations, isolation.KubeToleration{Key: t.Key, Operator: t.Operator, Value: t.Value, Effect: t.Effect})
	}
	p.Kube = isolation.KubePlan{
		Namespace:        k.Namespaced(),
		Image:            image,
		ImagePullPolicy:  k.PullPolicy(),
		RuntimeClass:     k.RuntimeClass,
		NodeSelector:     maps.Clone(k.NodeSelector),
		Tolerations:      tolerations,
		ServiceAccount:   k.ServiceAccount,
		ProxyAddr:        k.ProxyListen,
		EgressVerifiedBy: k.VerifiedBy(),
		Warm:             k.WarmPods(),
	}
	if k.WorkspaceMode() == config.KubeWorkspacePVC {
		p.Kube.Workspace = isolation.KubeWorkspacePVC
		p.Kube.StorageClass = k.StorageClass
		p.Kube.WorkspaceSize = int64(k.ClaimSize(a.WorkspaceQuota))
		p.Kube.AccessMode = k.AccessMode()
	}
	c.why["backend"] = "kubernetes — backend = \"kubernetes\": a fresh pod per message in the [kubernetes] cluster (" + k.String() + "), deleted afterwards; the request reaches berth-agent on its stdin over pods/attach"
	c.why["limits"] = fmt.Sprintf("memory %s and 1 CPU as the pod's requests and limits (container_mode.memory_limit); /tmp a memory emptyDir of %s; no per-pod process limit exists in Kubernetes",
		isolation.FormatBytes(p.Limits.MemoryBytes), isolation.FormatBytes(DefaultTmpfs))
	c.why["network"] = "none but berth's egress router at " + k.ProxyListen + ": a NetworkPolicy per namespace allows only it, and " + verifiedWhy(k.VerifiedBy())
	c.why["policy"] = "inside the pod berth-agent confines itself with Landlock: /workspace and /tmp read-write, the system set read-only"
	hardening := "read-only root, no capabilities, no privilege escalation, seccomp RuntimeDefault, no service account token"
	if p.Kube.Workspace == isolation.KubeWorkspacePVC {
		class := "the cluster's default storage class"
		if k.StorageClass != "" {
			class = "storage class " + k.StorageClass
		}
		c.why["mounts"] = fmt.Sprintf("the workspace at /workspace is the agent's own PersistentVolumeClaim ([kubernetes] workspace = \"pvc\": %s, %s, %s; created if missing, never deleted by berth), so it persists between messages; no other agent's pod mounts it; %s",
			class, isolation.FormatBytes(p.Kube.WorkspaceSize), p.Kube.AccessMode, hardening)
	} else {
		c.why["mounts"] = "the workspace at /workspace is an emptyDir of the pod (it does not persist between messages; [kubernetes] workspace = \"pvc\" keeps it); " + hardening
	}
	if image != "" {
		c.why["image"] = image + " (container_mode.image or [agents.image_config] image; the nodes must have it or pull it: imagePullPolicy " + k.PullPolicy() + ")"
	} else {
		c.why["image"] = "the agent's isolation image from berth-imaged; the nodes must have it (load it into their runtime, or push it to a registry and set container_mode.image)"
	}
	if k.RuntimeClass != "" {
		c.why["runtime"] = k.RuntimeClass + " ([kubernetes] runtime_class)"
	} else {
		c.why["runtime"] = "the cluster's default ([kubernetes] runtime_class unset)"
	}
	if p.Kube.Warm > 0 {
		c.why["warm"] = fmt.Sprintf("%d started pod(s) kept waiting on stdin with no run and no request ([kubernetes] warm); a message without egress takes one, which is deleted after it", p.Kube.Warm)
	} else {
		c.why["warm"] = "none ([kubernetes] warm = 0): each message creates its pod"
	}
}

func verifiedWhy(by string) string {
	if by == config.EgressVerifiedByAdmin {
		return "the admin vouches that the cluster enforces it ([kubernetes] egress_verified_by = \"admin\")"
	}
	return "because the cluster's CNI may not enforce it, a probe pod must fail to reach the API server and the host directly before the first run (every run fails closed otherwise)"
}

// kubeEgress points a kubernetes run's agent at berth's egress router
// instead of a socket it cannot reach: the router hands each connection to
// the run's own proxy by its token. The CA of [[egress.secrets]], git rules
// and read-only egress reaches the pod as a ConfigMap.
func kubeEgress(c *compiled, cfg *config.Config, e *isolation.EgressPlan) {
	addr := cfg.Kubernetes.ProxyListen
	_, portStr, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil {
		c.problems = append(c.problems, isolation.Errorf(isolation.ReasonStart, "[kubernetes] proxy_listen %q is not an IP:port address", addr))
		return
	}
	e.SandboxSocket = isolation.KubeEgressSocketPrefix + addr
	c.plan.Policy.ConnectPorts = append(slices.Clone(c.plan.Policy.ConnectPorts), uint16(port))
	if e.CABundle != "" {
		// The backend puts the CA's certificate (never its key) in a
		// ConfigMap of the pod, mounted read-only there (isolation/kube/ca.go).
		e.SandboxCABundle = path.Join(isolation.SandboxEgressDir, isolation.EgressCABundleName)
		c.plan.Policy.AllowRead = append(slices.Clone(c.plan.Policy.AllowRead), e.SandboxCABundle)
		c.why["egress_ca"] = "the run's egress CA certificate (its key stays with berth-egress on this host) in a ConfigMap owned by the pod, mounted read-only at " + e.SandboxCABundle
	}
	c.why["egress_route"] = fmt.Sprintf("berth-agent in the pod relays to berth's egress router at %s (Proxy-Authorization with the run's token picks the run's own proxy; another pod's token is another run's, and no token is refused)", addr)
}
