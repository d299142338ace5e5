package kube_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// The pod built from a plan refuses root and a plan without limits, and
// carries the plan's placement; its spec never holds a request.
func TestKubernetesPodForRefusesWhatItCannotConfine(t *testing.T) {
	c := cluster{ns: "berth", proxy: "10.231.0.1:17000"}
	base := c.spec(t, "berth-agent:x", "hi")
	for name, mut := range map[string]func(*isolation.Plan){
		"root":             func(p *isolation.Plan) { p.User = &isolation.RunUser{Name: "root"} },
		"no memory limit":  func(p *isolation.Plan) { p.Limits.MemoryBytes = 0 },
		"no /tmp size":     func(p *isolation.Plan) { p.Limits.TmpfsBytes = 0 },
		"no image":         func(p *isolation.Plan) { p.Kube.Image = "" },
		"a direct network": func(p *isolation.Plan) { p.Network.Allowed = true },
	} {
		p := base.Plan
		mut(&p)
		if _, _, err := kube.PodFor(p, "i"); err == nil {
			t.Errorf("%s: PodFor accepted the plan", name)
		}
	}
	p := base.Plan
	p.Kube.RuntimeClass, p.Kube.NodeSelector = "gvisor", map[string]string{"pool": "agents"}
	p.Kube.Tolerations = []isolation.KubeToleration{{Key: "dedicated", Operator: "Equal", Value: "agents", Effect: "NoSchedule"}}
	pod, hash, err := kube.PodFor(p, "i")
	if err != nil {
		t.Fatal(err)
	}
	if *pod.Spec.RuntimeClassName != "gvisor" || pod.Spec.NodeSelector["pool"] != "agents" || len(pod.Spec.Tolerations) != 1 || hash == "" {
		t.Errorf("placement not in the pod: %+v", pod.Spec)
	}
	if d := *pod.Spec.ActiveDeadlineSeconds; d < int64(p.Timeout/time.Second) {
		t.Errorf("activeDeadlineSeconds %d is shorter than the run's timeout", d)
	}
	data, _ := json.Marshal(pod)
	if strings.Contains(string(data), secret) {
		t.Errorf("the key is in the pod: %s", data)
	}
	p.Kube.Image = "berth-agent:y"
	if _, other, _ := kube.PodFor(p, "i"); other == hash {
		t.Error("another image gives the same config hash: a stale warm pod would serve")
	}
}

// A probe proves pods are confined only when the router answered and every
// canary failed the way wget says a connection fails; anything else fails
// closed.
func TestKubernetesProbeVerdictFailsClosed(t *testing.T) {
	const control, a, b = "10.231.0.1:17000", "10.0.0.5:6443", "10.231.0.1:40000"
	canaries := []string{a, b}
	ok := "probe " + control + " HTTP/1.1 407 Proxy Authentication Required\n" +
		"probe " + a + " nc: can't connect to remote host (10.0.0.5): Network is unreachable\n" +
		"probe " + b + " nc: can't connect to remote host (10.231.0.1): Connection refused\n"
	if reached, err := kube.ProbeVerdict(ok, control, canaries); err != nil || len(reached) != 0 {
		t.Errorf("a confined pod's probe: reached %v, %v", reached, err)
	}
	leaky := strings.Replace(ok, "nc: can't connect to remote host (10.0.0.5): Network is unreachable", "berth-probe-canary", 1)
	if reached, err := kube.ProbeVerdict(leaky, control, canaries); err != nil || len(reached) != 1 || reached[0] != a {
		t.Errorf("a pod that reached %s: reached %v, %v", a, reached, err)
	}
	odd := strings.Replace(ok, "nc: can't connect to remote host (10.231.0.1): Connection refused", "nc: something else", 1)
	if reached, _ := kube.ProbeVerdict(odd, control, canaries); len(reached) != 1 {
		t.Errorf("an answer the probe does not know counts as reached; got %v", reached)
	}
	noRouter := strings.Replace(ok, "HTTP/1.1 407 Proxy Authentication Required", "download timed out", 1)
	if _, err := kube.ProbeVerdict(noRouter, control, canaries); err == nil {
		t.Error("a probe that did not reach the router proved confinement")
	}
	if _, err := kube.ProbeVerdict(strings.SplitN(ok, "\n", 2)[0], control, canaries); err == nil {
		t.Error("a probe that reported no canary proved confinement")
	}
}
