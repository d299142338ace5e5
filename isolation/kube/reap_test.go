package kube_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-dev/berth/internal/testkit/testkube"
)

// execIn runs argv in the agent container of pod over pods/exec, as an
// admin would with kubectl exec, and returns its stdout.
func (c cluster) execIn(t *testing.T, pod string, argv ...string) string {
	t.Helper()
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "agent", Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(testkube.Config(t), "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		t.Fatalf("exec %q in pod %s: %v\n%s", argv, pod, err, stderr.String())
	}
	return stdout.String()
}

// process is one line of /proc/<pid>/stat.
type process struct {
	pid, ppid int
	comm      string
	state     string
}

// processes reads every process of pod's shared process namespace from
// /proc, in the pod, through exec rather than through berth-agent.
func (c cluster) processes(t *testing.T, pod string) []process {
	t.Helper()
	var all []process
	for line := range strings.SplitSeq(c.execIn(t, pod, "sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null"), "\n") {
		open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
		if open < 0 || closing < open {
			continue
		}
		var p process
		p.comm = line[open+1 : closing]
		if _, err := fmt.Sscanf(line[:open], "%d", &p.pid); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(line[closing+1:], " %s %d", &p.state, &p.ppid); err != nil {
			continue
		}
		all = append(all, p)
	}
	return all
}

// A conversation pod reaps what its tools leave behind: orphans of a tool
// are handed to the pod's PID 1 (the pause process: the pod shares its
// process namespace), which waits for them when they end, so a long
// conversation does not fill the pod with zombies. Control: a zombie whose
// living parent never waits (sh exec'd into sleep after starting a child)
// is seen by the same reading, and that parent is itself an orphan of the
// tool under PID 1, so the orphans did go to the pause process.
func TestKubernetesConversationPodReapsWhatItsToolsLeave(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	k := startKept(t, c.b, c.keptSpec(t, img))
	pod := podName(k.Handle())

	got := keptShell(t, k, "for i in 1 2 3 4 5; do (sleep 0 &); (true &); done; "+
		"(sh -c 'sleep 0 & exec sleep 120' >/dev/null 2>&1 &); sleep 1; echo left")
	if !slices.Contains(got, "left") {
		t.Fatalf("the tool did not run: %q", got)
	}
	// A second message of the conversation leaves more.
	keptShell(t, k, "(sleep 0 &); (sleep 0 &); echo again")

	var procs []process
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs = c.processes(t, pod)
		var ofPause, ofKeeper []process
		var keeper *process
		for i, p := range procs {
			if p.comm == "sleep" && p.ppid == 1 && p.state != "Z" {
				keeper = &procs[i]
			}
		}
		for _, p := range procs {
			if p.state != "Z" {
				continue
			}
			if p.ppid == 1 {
				ofPause = append(ofPause, p)
			} else if keeper != nil && p.ppid == keeper.pid {
				ofKeeper = append(ofKeeper, p)
			}
		}
		if len(procs) == 0 || procs[0].pid != 1 || procs[0].comm != "pause" {
			t.Fatalf("PID 1 of the pod is not the pause process: %+v", procs)
		}
		if keeper == nil || len(ofKeeper) != 1 {
			t.Fatalf("control: no zombie under the tool's orphan that never waits (sleep, parent PID 1); processes: %+v", procs)
		}
		if len(ofPause) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zombies of the tools are left under the pod's PID 1 (it does not reap): %+v", len(ofPause), ofPause)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("processes of the pod after two messages: %+v", procs)
}
