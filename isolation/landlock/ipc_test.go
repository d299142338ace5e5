package landlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// msgKey is a SysV IPC key no other test uses.
func msgKey() string { return fmt.Sprintf("0x%08x", 0x42000000|rand.Uint32N(0xffffff)) }

// hostQueue makes (create) or finds a message queue in the host's IPC
// namespace; it reports the queue id or the error.
func hostQueue(t *testing.T, key string, create bool) (int, error) {
	t.Helper()
	k, err := strconv.ParseInt(key, 0, 32)
	if err != nil {
		t.Fatal(err)
	}
	flags := uintptr(0)
	if create {
		flags = unix.IPC_CREAT | unix.IPC_EXCL | 0o666
	}
	id, _, e := unix.Syscall(unix.SYS_MSGGET, uintptr(k), flags, 0)
	if e != 0 {
		return 0, e
	}
	return int(id), nil
}

func removeQueue(id int) { _, _, _ = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0) }

// asNobody runs the probe as nobody outside any sandbox: the control.
func asNobody(t *testing.T, args ...string) string {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd := exec.Command(sysprobeBinary(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sysprobe %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// A confined host run has an IPC namespace of its own: a message queue the
// host (or another agent) made is not there, and one the run makes is seen
// neither by another run at the same time nor by the host. Outside the
// sandbox the same probe finds the host's queue, so the namespace is what
// hides it.
func TestRunsDoNotShareSysVIPC(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	hostKey, runKey := msgKey(), msgKey()
	id, err := hostQueue(t, hostKey, true)
	if err != nil {
		t.Fatalf("cannot make the host's queue: %v", err)
	}
	t.Cleanup(func() { removeQueue(id) })
	if got := asNobody(t, "msgget", hostKey, "find"); !strings.HasSuffix(got, " ok\n") {
		t.Fatalf("control: outside the sandbox the host's queue is %q, want ok", got)
	}

	// The first run makes a queue and waits, its queue alive, until told.
	first := spec(t, berthAgent, "")
	first.Request.Workspace = first.Workspace
	probe := sysprobeBinary(t)
	first.Policy = isolation.HostPolicy(isolation.FileAccess{AllowRead: []string{probe}}, first.Workspace, nil)
	made, finish := filepath.Join(first.Workspace, "made"), filepath.Join(first.Workspace, "finish")
	first.Request.Message.Text = fmt.Sprintf("/sh %s msgget %s find; %s msgget %s create > made.tmp; mv made.tmp made; while [ ! -e %s ]; do sleep 0.05; done",
		probe, hostKey, probe, runKey, finish)
	type ran struct {
		res isolation.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := landlock.New().Run(context.Background(), first)
		done <- ran{res, err}
	}()
	t.Cleanup(func() { os.WriteFile(finish, nil, 0o644) })
	waitFor(t, made)
	madeLine, _ := os.ReadFile(made)
	if !strings.HasSuffix(string(madeLine), " ok\n") {
		t.Fatalf("the first run could not make its queue: %q", madeLine)
	}

	second := toolRun(t, confined, "sysprobe msgget "+runKey+" find", func(s *isolation.Spec) {
		s.RunID += "-second"
		s.Request.RunID = s.RunID
	})
	if got := probeLine(second, "msgget "+runKey+" find"); !strings.HasSuffix(got, "no such file or directory") {
		t.Errorf("another run sees the first run's queue: %q", got)
	}
	if qid, err := hostQueue(t, runKey, false); !errors.Is(err, unix.ENOENT) {
		if err == nil {
			removeQueue(qid)
		}
		t.Errorf("the host sees the run's queue (err %v), want ENOENT", err)
	}

	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("first run failed: %v\nstderr: %s", r.err, r.res.Stderr)
	}
	if got := probeLine(r.res.Response.Reply, "msgget "+hostKey+" find"); !strings.HasSuffix(got, "no such file or directory") {
		t.Errorf("the run sees the host's queue: %q\nreply:\n%s", got, r.res.Response.Reply)
	}
}

// Kernel keyrings are not namespaced, so the filter refuses them: a key
// left in a keyring by one run could be read by another agent's run.
// An unrestricted run (no filter) adds one, so the filter is what refuses.
func TestToolsCannotUseKernelKeyrings(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	tests := []struct {
		name string
		kind backendKind
		want string
	}{
		{"A_confined_run_is_refused_with_EPERM", confined, "refused: operation not permitted"},
		{"An_unrestricted_run_is_not_filtered", unconfined, " ok"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reply := toolRun(t, tc.kind, "sysprobe addkey user; sysprobe addkey process", nil)
			for _, ring := range []string{"user", "process"} {
				if got := probeLine(reply, "addkey "+ring); !strings.HasSuffix(got, tc.want) {
					t.Errorf("%q, want it to end in %q\nreply:\n%s", got, tc.want, reply)
				}
			}
		})
	}
}
