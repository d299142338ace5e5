package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestKubernetesTableAndBackendResolve(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": `[kubernetes]
kubeconfig = "/etc/berth/kubeconfig"
namespace = "agents"
runtime_class = "gvisor"
image_pull_policy = "Never"
service_account = "berth-runs"
warm = 2
proxy_listen = "10.88.0.1:3129"
egress_verified_by = "admin"
node_selector = { "kubernetes.io/os" = "linux", pool = "agents" }
[[kubernetes.tolerations]]
key = "dedicated"
operator = "Equal"
value = "agents"
effect = "NoSchedule"
[agent_defaults]
backend = "kubernetes"
[[agents]]
id = "pod"
[[agents]]
id = "here"
backend = "local"
`})
	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	k := c.Kubernetes
	if k.Kubeconfig != "/etc/berth/kubeconfig" || k.Namespaced() != "agents" || k.RuntimeClass != "gvisor" || k.PullPolicy() != "Never" ||
		k.ServiceAccount != "berth-runs" || k.WarmPods() != 2 || k.ProxyListen != "10.88.0.1:3129" || k.VerifiedBy() != config.EgressVerifiedByAdmin {
		t.Errorf("[kubernetes] = %+v", k)
	}
	if k.NodeSelector["kubernetes.io/os"] != "linux" || k.NodeSelector["pool"] != "agents" || len(k.Tolerations) != 1 || k.Tolerations[0] != (config.KubeToleration{Key: "dedicated", Operator: "Equal", Value: "agents", Effect: "NoSchedule"}) {
		t.Errorf("node_selector %v, tolerations %+v", k.NodeSelector, k.Tolerations)
	}
	pod, _ := c.Agent("pod")
	here, _ := c.Agent("here")
	if pod.Isolation != config.BackendKubernetes || here.Isolation != "landlock" {
		t.Errorf("isolation: pod %q (want kubernetes from [agent_defaults]), here %q (want landlock: backend = local)", pod.Isolation, here.Isolation)
	}
	defaults, err := config.Load(writeConfig(t, map[string]string{"berth.toml": "[[agents]]\nid = \"a\"\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if d := defaults.Kubernetes; d.Namespaced() != config.DefaultKubeNamespace || d.PullPolicy() != "IfNotPresent" || d.VerifiedBy() != config.EgressVerifiedByProbe || d.WarmPods() != 0 {
		t.Errorf("defaults of [kubernetes]: %+v", d)
	}
}

func TestKubernetesBadValuesNameFileLineAndKey(t *testing.T) {
	t.Parallel()
	const agent = "[[agents]]\nid = \"a\"\nbackend = \"kubernetes\"\n"
	for _, tc := range []struct{ name, toml, want string }{
		{"An unknown backend", "[[agents]]\nid = \"a\"\nbackend = \"nomad\"\n", `berth.toml:3: agents[0].backend: "nomad" is not one of local, kubernetes`},
		{"A namespace that is no name", "[kubernetes]\nnamespace = \"Berth_Agents\"\n", `berth.toml:2: kubernetes.namespace: "Berth_Agents" is not a Kubernetes name`},
		{"An unknown pull policy", "[kubernetes]\nimage_pull_policy = \"Sometimes\"\n", `berth.toml:2: kubernetes.image_pull_policy: "Sometimes" is not one of Never, IfNotPresent, Always`},
		{"A router on loopback", "[kubernetes]\nproxy_listen = \"127.0.0.1:3129\"\n", `berth.toml:2: kubernetes.proxy_listen: "127.0.0.1:3129": a pod cannot reach the host's loopback`},
		{"A router on every address", "[kubernetes]\nproxy_listen = \"0.0.0.0:3129\"\n", "kubernetes.proxy_listen"},
		{"A router named by host name", "[kubernetes]\nproxy_listen = \"berth.local:3129\"\n", "the host must be an IP address"},
		{"An unknown verifier", "[kubernetes]\negress_verified_by = \"hope\"\n", `berth.toml:2: kubernetes.egress_verified_by: "hope" is not one of probe, admin`},
		{"A bad toleration effect", "[[kubernetes.tolerations]]\nkey = \"k\"\neffect = \"Sometimes\"\n", `kubernetes.tolerations[0].effect: "Sometimes" is not one of`},
		{"A node selector value that is no label", "[kubernetes]\nnode_selector = { pool = \"a b\" }\n", `berth.toml:2: kubernetes.node_selector`},
		{"Too many warm pods", "[kubernetes]\nwarm = 1000\n", "berth.toml:2: kubernetes.warm"},
		{"A kubernetes agent without a router", agent, `berth.toml:3: agents[0].backend: agent "a" runs on kubernetes, which needs [kubernetes] proxy_listen`},
		{"An unknown workspace", "[kubernetes]\nworkspace = \"nfs\"\n", `berth.toml:2: kubernetes.workspace: "nfs" is not one of emptydir, pvc`},
		{"An unknown access mode", "[kubernetes]\nworkspace_access_mode = \"ReadOnlyMany\"\n", `berth.toml:2: kubernetes.workspace_access_mode: "ReadOnlyMany" is not one of ReadWriteOnce, ReadWriteOncePod, ReadWriteMany`},
		{"A storage class that is no name", "[kubernetes]\nstorage_class = \"Fast SSD\"\n", `berth.toml:2: kubernetes.storage_class: "Fast SSD" is not a Kubernetes object name`},
		{"A workspace size that is no size", "[kubernetes]\nworkspace_size = \"lots\"\n", `berth.toml:2: kubernetes.workspace_size`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": tc.toml}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
