package kube

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"
)

// The memory of a kept pod (berthctl sandboxes, Cockpit) is its agent
// container's working set: usage minus inactive file pages, as the kubelet
// counts it. It is read in two ways, the first that answers wins:
//
//  1. the container's own cgroup, read by `cat` over pods/exec (create on
//     pods/exec in berth's namespace, the power pods/attach already has);
//  2. the kubelet's stats/summary through the API server's node proxy (get
//     on nodes/proxy: cluster-wide, and it reaches every kubelet API, so it
//     is the fallback, not the advice).
//
// The node proxy is refused outright ("address not allowed") when the API
// server reaches the kubelet at a loopback or link-local address, as on a
// single-node test cluster; exec does not go through that check. When both
// fail the error says why each did, so the listing can say "unknown" and why.

// cgroupMemoryFiles are the agent container's memory files under cgroup v2
// and v1; only one pair exists in a container, cat skips the other.
var cgroupMemoryFiles = []string{
	"/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
	"/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.stat",
}

// podMemory is the working set of the agent container of pod ns/name.
func (b *Backend) podMemory(ctx context.Context, ns, name string) (int64, error) {
	ctx, cancel := b.call(ctx)
	defer cancel()
	mem, execErr := b.cgroupMemory(ctx, ns, name)
	if execErr == nil {
		return mem, nil
	}
	mem, proxyErr := b.kubeletMemory(ctx, ns, name)
	if proxyErr == nil {
		return mem, nil
	}
	return 0, fmt.Errorf("the memory of pod %s/%s is unknown: %w; %w", ns, name, execErr, proxyErr)
}

// cgroupMemory reads the container's cgroup over pods/exec.
func (b *Backend) cgroupMemory(ctx context.Context, ns, name string) (int64, error) {
	exec, err := b.streamer(ns, name, "exec", &corev1.PodExecOptions{Container: agentContainer, Command: append([]string{"cat"}, cgroupMemoryFiles...), Stdout: true, Stderr: true})
	if err != nil {
		return 0, fmt.Errorf("cannot exec in it: %w", err)
	}
	var stdout, stderr bytes.Buffer
	// cat exits 1 for the files of the other cgroup version: what it
	// printed decides, its exit status does not.
	streamErr := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	if mem, ok := workingSet(stdout.Bytes()); ok {
		return mem, nil
	}
	if streamErr == nil {
		streamErr = errors.New("no usage in its output")
	}
	why := strings.TrimSpace(stderr.String())
	if len(why) > 200 {
		why = why[:200] + "…"
	}
	if why != "" {
		why = " (" + why + ")"
	}
	return 0, fmt.Errorf("cannot read its cgroup with cat over pods/exec: %w%s", streamErr, why)
}

// workingSet is usage minus inactive file pages from the cat of
// cgroupMemoryFiles: a bare number is the usage, memory.stat the rest
// (total_inactive_file under v1, which counts the hierarchy).
func workingSet(out []byte) (int64, bool) {
	var usage, inactive, totalInactive int64 = -1, 0, -1
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		switch {
		case len(fields) == 1:
			if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
				usage = n
			}
		case len(fields) == 2 && fields[0] == "inactive_file":
			inactive, _ = strconv.ParseInt(fields[1], 10, 64)
		case len(fields) == 2 && fields[0] == "total_inactive_file":
			totalInactive, _ = strconv.ParseInt(fields[1], 10, 64)
		}
	}
	if usage < 0 {
		return 0, false
	}
	if totalInactive >= 0 {
		inactive = totalInactive
	}
	return max(usage-inactive, 0), true
}

// kubeletMemory reads the node's stats/summary through the API server's
// node proxy.
func (b *Backend) kubeletMemory(ctx context.Context, ns, name string) (int64, error) {
	pod, err := b.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("cannot read the pod: %w", err)
	}
	node := pod.Spec.NodeName
	if node == "" {
		return 0, errors.New("the pod has no node")
	}
	data, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("node %s's kubelet stats/summary through the API server's node proxy: %w", node, err)
	}
	var summary struct {
		Pods []struct {
			PodRef struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"podRef"`
			Containers []struct {
				Name   string `json:"name"`
				Memory *struct {
					WorkingSetBytes *uint64 `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"containers"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(data, &summary); err != nil {
		return 0, fmt.Errorf("cannot read node %s's stats summary: %w", node, err)
	}
	for _, p := range summary.Pods {
		if p.PodRef.Name != name || p.PodRef.Namespace != ns {
			continue
		}
		for _, c := range p.Containers {
			if c.Name == agentContainer && c.Memory != nil && c.Memory.WorkingSetBytes != nil {
				return int64(*c.Memory.WorkingSetBytes), nil
			}
		}
	}
	return 0, fmt.Errorf("node %s's kubelet reports no memory of the pod yet", node)
}
