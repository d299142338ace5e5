package runplan_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

const kubeConfig = `
[kubernetes]
namespace = "agents"
proxy_listen = "10.88.0.1:3129"
runtime_class = "gvisor"
image_pull_policy = "Never"
warm = 1
node_selector = { pool = "agents" }

[[agents]]
id = "podded"
backend = "kubernetes"
container_mode = { image = "berth-agent:test", memory_limit = "256m" }
egress.allow = ["example.com"]
`

// A kubernetes agent's plan is a pod's: no network but the router's
// address, whose port berth-agent's Landlock lets it connect to, and the
// [kubernetes] placement; the key stays with the proxy.
func TestKubernetesPlanRoutesEgressThroughTheRouterAndPlacesThePod(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, kubeConfig)
	p, err := runplan.Compile(cfg, "podded", "r1", facts(t, map[string]string{"CLOUD_KEY": secret}))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	if p.Backend != isolation.BackendKubernetes {
		t.Fatalf("backend %q, want kubernetes", p.Backend)
	}
	k := p.Kube
	if k.Namespace != "agents" || k.Image != "berth-agent:test" || k.ImagePullPolicy != "Never" || k.RuntimeClass != "gvisor" || k.Warm != 1 || k.NodeSelector["pool"] != "agents" || k.ProxyAddr != "10.88.0.1:3129" || k.EgressVerifiedBy != "probe" {
		t.Errorf("kube plan %+v", k)
	}
	if p.Network.Allowed || p.Limits.MemoryBytes != 256<<20 || p.Limits.TmpfsBytes == 0 || p.SandboxWorkspace != isolation.ContainerWorkspace {
		t.Errorf("network %+v, limits %+v, workspace %q", p.Network, p.Limits, p.SandboxWorkspace)
	}
	if p.Egress == nil || p.Egress.SandboxSocket != "tcp:10.88.0.1:3129" || !slices.Contains(p.Policy.ConnectPorts, 3129) || !slices.Contains(p.Policy.ConnectPorts, isolation.EgressProxyPort) {
		t.Fatalf("egress %+v, connect ports %v: want the router's address and port", p.Egress, p.Policy.ConnectPorts)
	}
	ex, err := runplan.Explain(cfg, "podded", facts(t, map[string]string{"CLOUD_KEY": secret}))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"backend": "kubernetes", "network": "probe pod", "egress_route": "10.88.0.1:3129", "warm": "1 started pod"} {
		if !strings.Contains(ex.Why[key], want) {
			t.Errorf("why[%s] = %q, want it to say %q", key, ex.Why[key], want)
		}
	}
}

// A kubernetes run with [[egress.secrets]] gets the run's CA where its pod
// mounts it (isolation/kube's ConfigMap), readable under its Landlock; the
// secret's value is nowhere in the plan the pod is made from.
func TestKubernetesPlanGivesThePodTheRunsCA(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, kubeConfig+`
[[egress.secrets]]
name = "api"
env = "API_TOKEN"
hosts = ["example.com"]
`)
	p, err := runplan.Compile(cfg, "podded", "r1", facts(t, map[string]string{"CLOUD_KEY": secret, "API_TOKEN": "t0ken-value"}))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	e := p.Egress
	if e == nil || e.CABundle == "" || e.SandboxCABundle != "/run/berth-egress/ca.pem" || !slices.Contains(p.Policy.AllowRead, e.SandboxCABundle) {
		t.Fatalf("egress %+v, allow_read %v: want the CA at /run/berth-egress/ca.pem, readable", e, p.Policy.AllowRead)
	}
	data, _ := json.Marshal(p.Kube)
	if strings.Contains(string(data), "t0ken-value") {
		t.Errorf("the secret is in the pod's placement: %s", data)
	}
}

// With [kubernetes] workspace = "pvc" the plan names the agent's claim's
// class, size (the agent's workspace_quota unless workspace_size is set)
// and access mode, and explain says the workspace persists; without it the
// workspace is an emptyDir and explain says it does not.
func TestKubernetesPlanCarriesTheWorkspaceClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, extra string
		want        isolation.KubePlan
		why         string
	}{
		{"emptyDir by default", "", isolation.KubePlan{}, "does not persist"},
		{"a claim of the agent's quota", "workspace = \"pvc\"\nstorage_class = \"fast.ssd\"\n",
			isolation.KubePlan{Workspace: "pvc", StorageClass: "fast.ssd", WorkspaceSize: 1 << 30, AccessMode: "ReadWriteOnce"}, "persists between messages"},
		{"a claim of workspace_size", "workspace = \"pvc\"\nworkspace_size = \"2g\"\nworkspace_access_mode = \"ReadWriteMany\"\n",
			isolation.KubePlan{Workspace: "pvc", WorkspaceSize: 2 << 30, AccessMode: "ReadWriteMany"}, "the cluster's default storage class"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, strings.Replace(kubeConfig, "warm = 1\n", "warm = 1\n"+tc.extra, 1))
			p, err := runplan.Compile(cfg, "podded", "r1", facts(t, map[string]string{"CLOUD_KEY": secret}))
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			k := p.Kube
			if k.Workspace != tc.want.Workspace || k.StorageClass != tc.want.StorageClass || k.WorkspaceSize != tc.want.WorkspaceSize || k.AccessMode != tc.want.AccessMode {
				t.Errorf("kube plan workspace %q class %q size %d mode %q, want %+v", k.Workspace, k.StorageClass, k.WorkspaceSize, k.AccessMode, tc.want)
			}
			ex, err := runplan.Explain(cfg, "podded", facts(t, map[string]string{"CLOUD_KEY": secret}))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(ex.Why["mounts"], tc.why) {
				t.Errorf("why[mounts] = %q, want it to say %q", ex.Why["mounts"], tc.why)
			}
		})
	}
}
