package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/berth-dev/berth/isolation"
)

// ready makes sure a plan's namespace confines its pods before the first
// one runs: the NetworkPolicy, then (unless the admin vouched for the
// cluster) the probe. Both are done once per namespace and process; a
// probe that fails is tried again by the next run.
func (b *Backend) ready(ctx context.Context, p isolation.Plan) error {
	ns := p.Kube.Namespace
	b.mu.Lock()
	b.namespaces[ns] = true
	policyFor, verified := b.policies[ns], b.verified[ns]
	b.mu.Unlock()
	if policyFor != p.Kube.ProxyAddr || policyFor == "" && p.Kube.ProxyAddr == "" {
		if err := b.ensurePolicy(ctx, ns, p.Kube.ProxyAddr); err != nil {
			return err
		}
		b.mu.Lock()
		b.policies[ns] = p.Kube.ProxyAddr
		b.mu.Unlock()
	}
	if verified || p.Kube.EgressVerifiedBy == "admin" {
		return nil
	}
	if err := b.probe(ctx, p); err != nil {
		return err
	}
	b.mu.Lock()
	b.verified[ns] = true
	b.mu.Unlock()
	return nil
}

// PolicyName is the name of the NetworkPolicy of an instance's pods.
func PolicyName(instance string) string { return "berth-" + instance }

// ensurePolicy creates (or updates) the NetworkPolicy that lets this
// instance's pods reach only berth's egress router, and nothing reach them.
func (b *Backend) ensurePolicy(ctx context.Context, ns, proxyAddr string) error {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName(b.instance), Namespace: ns, Labels: map[string]string{LabelInstance: b.instance}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelInstance: b.instance}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{},
			Egress:      []networkingv1.NetworkPolicyEgressRule{},
		},
	}
	if proxyAddr != "" {
		host, port, err := splitHostPort(proxyAddr)
		if err != nil {
			return isolation.Errorf(isolation.ReasonConfinement, "[kubernetes] proxy_listen %q: %v", proxyAddr, err)
		}
		bits := "/32"
		if strings.Contains(host, ":") {
			bits = "/128"
		}
		tcp := corev1.ProtocolTCP
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: host + bits}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(int32(port)))}},
		}}
	}
	policies := b.cs.NetworkingV1().NetworkPolicies(ns)
	callCtx, cancel := b.call(ctx)
	defer cancel()
	_, err := policies.Create(callCtx, np, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var cur *networkingv1.NetworkPolicy
		if cur, err = policies.Get(callCtx, np.Name, metav1.GetOptions{}); err == nil {
			np.ResourceVersion = cur.ResourceVersion
			_, err = policies.Update(callCtx, np, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return b.apiError(fmt.Sprintf("create the NetworkPolicy %s/%s that confines berth's pods", ns, np.Name), err)
	}
	return nil
}

func splitHostPort(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a port", portStr)
	}
	if net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("host %q is not an IP address", host)
	}
	return host, port, nil
}

// canaries are the addresses a probe pod must fail to reach directly: the
// API server (as this client reaches it, and as the kubernetes Service),
// and listeners of this process on the host's primary address and on the
// router's host at a port other than the router's, each of which answers
// if reached. The func closes the listeners.
func (b *Backend) canaries(ctx context.Context) ([]string, func()) {
	var out []string
	var closers []func()
	add := func(addr string) {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsLoopback() || ip.IsUnspecified() {
			return // a pod's loopback is its own
		}
		if !slices.Contains(out, addr) {
			out = append(out, addr)
		}
	}
	listen := func(host string) {
		if host == "" {
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return
		}
		closers = append(closers, serveProbe(ln, "berth-probe-canary"))
		add(ln.Addr().String())
	}
	if u, err := url.Parse(b.rest.Host); err == nil && u.Host != "" {
		h, port, err := net.SplitHostPort(u.Host)
		if err != nil {
			h, port = u.Host, "443"
		}
		if ips, err := net.DefaultResolver.LookupHost(ctx, h); err == nil {
			for _, ip := range ips {
				add(net.JoinHostPort(ip, port))
			}
		}
	}
	if conn, err := net.Dial("udp", "192.0.2.1:9"); err == nil { // no packet is sent
		listen(conn.LocalAddr().(*net.UDPAddr).IP.String())
		conn.Close()
	}
	listen(b.proxyHost)
	callCtx, cancel := b.call(ctx)
	svc, err := b.cs.CoreV1().Services("default").Get(callCtx, "kubernetes", metav1.GetOptions{})
	cancel()
	if err == nil && svc.Spec.ClusterIP != "" {
		for _, port := range svc.Spec.Ports {
			add(net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(port.Port))))
		}
	}
	return out, func() {
		for _, c := range closers {
			c()
		}
	}
}

// serveProbe answers every HTTP request on ln with body; the func stops it.
func serveProbe(ln net.Listener, body string) func() {
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	return func() { srv.Close() }
}

// probeCreated, when set, is called with each probe pod once created: a
// test seam (a sweep at that moment).
var probeCreated atomic.Pointer[func(ns, name string)]

// probe runs a pod of the plan's image, under the plan's confinement and
// the namespace's NetworkPolicy, that tries each canary directly and
// berth's router: every canary must fail and the router must answer, or
// pods are not known to be confined and the run fails closed.
func (b *Backend) probe(ctx context.Context, p isolation.Plan) error {
	control := p.Kube.ProxyAddr
	if control == "" {
		return isolation.Errorf(isolation.ReasonConfinement, "cannot verify that pods have no way out: [kubernetes] proxy_listen is not set, so the probe has no address that must answer")
	}
	// The router answers a request without a token with 407; where it is
	// not listening yet, this process answers on its address instead.
	if ln, err := net.Listen("tcp", control); err == nil {
		defer serveProbe(ln, "berth-probe-control")()
	}
	canaries, closeCanaries := b.canaries(ctx)
	defer closeCanaries()
	var script strings.Builder
	for _, a := range append([]string{control}, canaries...) {
		host, port, _ := net.SplitHostPort(a)
		// A request, so the router (which waits for one) answers and closes.
		fmt.Fprintf(&script, "echo \"probe %s $(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 %s %s 2>&1 | tr '\\r\\n' '  ')\"\n", a, host, port)
	}
	// The probe needs no workspace: it never mounts the agent's claim.
	// Nor the run's CA: its ConfigMap is made for a run's pod only, and a
	// pod mounting one that does not exist never starts.
	noClaim := p
	noClaim.Kube.Workspace = ""
	if noClaim.Egress != nil {
		e := *noClaim.Egress
		e.CABundle, e.SandboxCABundle = "", ""
		noClaim.Egress = &e
	}
	pod, _, err := b.podFor(noClaim)
	if err != nil {
		return err
	}
	pod.Name = podName("probe-" + p.AgentID)
	pod.Labels[LabelProbe] = "true"
	pod.Spec.Containers = pod.Spec.Containers[:1] // no run's files: no files container
	pod.Spec.ActiveDeadlineSeconds = ptr(int64(120))
	c := &pod.Spec.Containers[0]
	c.Stdin, c.StdinOnce = false, false
	c.Command = []string{"/bin/sh", "-c", script.String()}
	// This scheduler's while it runs: a sweep at the same time (a restart
	// sweeps what the dead one left) must not take it for a leftover.
	b.own(pod.Name)
	defer b.disown(pod.Name)
	createCtx, cancel := b.call(ctx)
	_, err = b.cs.CoreV1().Pods(pod.Namespace).Create(createCtx, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return b.apiError("create the probe pod that checks pods have no way out", err)
	}
	if hook := probeCreated.Load(); hook != nil {
		(*hook)(pod.Namespace, pod.Name)
	}
	defer func() {
		if err := b.deletePod(pod.Namespace, pod.Name); err != nil {
			b.log.Warn("cannot delete the probe pod; the next sweep removes it", "pod", pod.Name, "err", err)
		}
	}()
	waitCtx, cancel := context.WithTimeout(ctx, b.start)
	defer cancel()
	if _, err := b.watchPod(waitCtx, pod.Namespace, pod.Name, func(pod *corev1.Pod) (bool, error) {
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				if _, err := started(pod, p); err != nil {
					return false, err
				}
			}
			if cs.State.Terminated != nil {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "the probe pod that checks pods have no way out did not run to its end; every kubernetes run fails closed until it does", Err: err}
	}
	logCtx, cancel := b.call(ctx)
	stream, err := b.cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: agentContainer}).Stream(logCtx)
	var out []byte
	if err == nil {
		out, err = io.ReadAll(io.LimitReader(stream, 64<<10))
		stream.Close()
	}
	cancel()
	if err != nil {
		return b.apiError("read the probe pod's log", err)
	}
	reached, err := ProbeVerdict(string(out), control, canaries)
	if err != nil {
		err = fmt.Errorf("%w; the probe's log: %q", err, isolation.WithTail("", string(out[:min(len(out), 2048)])))
		return &isolation.RunError{Reason: isolation.ReasonConfinement, Detail: "cannot verify that pods have no way out but berth's egress router; every kubernetes run fails closed until they have none (or set [kubernetes] egress_verified_by = \"admin\" for a cluster that enforces NetworkPolicy)", Err: err}
	}
	if len(reached) > 0 {
		return isolation.Errorf(isolation.ReasonConfinement, "pods of namespace %s reach %s directly: the cluster does not confine them to berth's egress router (its CNI does not enforce the NetworkPolicy %s); every kubernetes run fails closed until it does",
			p.Kube.Namespace, strings.Join(reached, ", "), PolicyName(b.instance))
	}
	b.log.Info("a probe pod found no way out of the namespace but berth's egress router", "namespace", p.Kube.Namespace, "canaries", canaries)
	return nil
}

// ProbeVerdict reads a probe's log: the canaries it reached, or an error
// when the router's address did not answer (then the probe proves
// nothing). Only a failure busybox nc names is a failure: anything else
// counts as reached (fail closed).
func ProbeVerdict(log, control string, canaries []string) ([]string, error) {
	lines := map[string]string{}
	for _, line := range strings.Split(log, "\n") {
		rest, ok := strings.CutPrefix(line, "probe ")
		if !ok {
			continue
		}
		addr, result, _ := strings.Cut(rest, " ")
		lines[addr] = result
	}
	got, ok := lines[control]
	if !ok || !strings.Contains(got, "berth-probe-control") && !strings.Contains(got, "407") {
		return nil, fmt.Errorf("the probe pod did not reach berth's egress router at %s (%q)", control, strings.TrimSpace(got))
	}
	var reached []string
	for _, c := range canaries {
		result, ok := lines[c]
		if !ok {
			return nil, errors.New("the probe pod did not report " + c)
		}
		blocked := false
		for _, failure := range []string{"Connection refused", "timed out", "Network is unreachable", "No route to host", "can't connect"} {
			blocked = blocked || strings.Contains(result, failure)
		}
		if !blocked {
			reached = append(reached, c)
		}
	}
	return reached, nil
}
