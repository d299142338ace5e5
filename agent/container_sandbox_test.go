package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

// In a container the agent's syscall filter sits on top of Docker's own
// profile, and the container has an IPC namespace of its own: a tool can
// neither add a kernel key nor see a message queue of the host.
func TestContainerToolsCannotUseKeyringsNorTheHostsIPC(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	_, err := os.Stat("/bin/busybox")
	testenv.Need(t, err == nil, "busybox-static is not installed")
	b, err := container.New(container.Options{Client: cli, Instance: t.Name() + "@" + strconv.Itoa(os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	// The probe goes in with the workspace (the image holds only the agent).
	probe, err := os.ReadFile(sysprobeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "sysprobe"), probe, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, filepath.Join(ws, "sysprobe")} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	key := 0x43000000 | time.Now().Nanosecond()&0xffffff
	id, _, e := unix.Syscall(unix.SYS_MSGGET, uintptr(key), unix.IPC_CREAT|unix.IPC_EXCL|0o666, 0)
	if e != 0 {
		t.Fatalf("cannot make the host's queue: %v", e)
	}
	t.Cleanup(func() { unix.Syscall(unix.SYS_MSGCTL, id, unix.IPC_RMID, 0) })

	runID := fmt.Sprintf("ipc%d", time.Now().UnixNano())
	text := fmt.Sprintf("/sh /workspace/sysprobe addkey user; /workspace/sysprobe addkey process; /workspace/sysprobe msgget %#x find", key)
	s := isolation.Spec{
		Plan: isolation.Plan{
			Backend: isolation.BackendContainer, RunID: runID, AgentID: "tester",
			Workspace: ws, SandboxWorkspace: isolation.ContainerWorkspace, AgentBinary: agentBinary, RunAs: "nobody",
			Timeout: 60 * time.Second, Policy: isolation.ContainerPolicy(false),
			Limits:  isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9, TmpfsBytes: 64 << 20},
			Network: isolation.Network{Mode: "none"},
			Mounts:  []isolation.Mount{{Source: ws, Target: isolation.ContainerWorkspace}},
		},
		Request: agentproto.Request{
			Version: agentproto.Version, RunID: runID, Agent: agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message:  agentproto.Message{ID: runID, Author: "t", Text: text},
			Provider: agentproto.Provider{Name: "local", Kind: "local"},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := b.Run(ctx, s)
	if err != nil {
		t.Fatalf("container run failed: %v\nstderr: %s", err, res.Stderr)
	}
	reply := res.Response.Reply
	for _, want := range []string{
		"addkey user refused: operation not permitted",
		"addkey process refused: operation not permitted",
		fmt.Sprintf("msgget %#x find refused: no such file or directory", key),
	} {
		if !strings.Contains(reply, want) {
			t.Errorf("reply lacks %q:\n%s", want, reply)
		}
	}
}
