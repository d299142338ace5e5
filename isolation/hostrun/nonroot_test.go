package hostrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// helperEnv makes the test binary act as a scheduler running as a non-root
// user: it runs one request and prints the outcome as JSON.
const helperEnv = "BERTH_HOSTRUN_TEST_HELPER"

type helperOutcome struct {
	Reason string `json:"reason"`
	Error  string `json:"error"`
	Reply  string `json:"reply"`
}

func runHelper() int {
	runAs := os.Getenv("HELPER_RUN_AS")
	text := os.Getenv("HELPER_TEXT")
	if text == "" {
		text = "whoami"
	}
	ws := os.Getenv("HELPER_WORKSPACE")
	s := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Workspace: ws, AgentBinary: os.Getenv("HELPER_AGENT"), RunAs: runAs, Timeout: 30 * time.Second, Limits: isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9}}, Request: agentproto.Request{
		Version: agentproto.Version, RunID: "r1",
		Message:  agentproto.Message{Text: text},
		Provider: agentproto.Provider{Name: "local", Kind: "local"},
	}}
	// A non-root scheduler cannot make cgroups: it runs with rlimits, by the
	// admin's choice ([scheduler] allow_rlimit_fallback).
	s.Limits.RlimitFallback = true
	if read := os.Getenv("HELPER_ALLOW_READ"); read != "" {
		// The real berth-agent: a Landlock policy as a host run gets it.
		s.Policy = isolation.HostPolicy(isolation.FileAccess{AllowRead: strings.Split(read, ":")}, ws, nil)
	}
	if socket := os.Getenv("HELPER_EGRESS_SOCKET"); socket != "" {
		s.Egress = &isolation.EgressPlan{Socket: socket, SandboxSocket: socket, ProxyAddr: "127.0.0.1:3128"}
		s.EgressToken = "tok-helper-0123456789abcdef"
	}
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	out := helperOutcome{Reply: res.Response.Reply, Reason: isolation.ReasonOf(err)}
	if err != nil {
		out.Error = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}

// runAsNobody runs this test binary as nobody in helper mode.
func runAsNobody(t *testing.T, runAs string, env ...string) helperOutcome {
	t.Helper()
	uid, gid := nobody(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "helper-"+filepath.Base(t.Name()))
	if err := copyFile(self, bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		helperEnv + "=1",
		"HELPER_RUN_AS=" + runAs,
		"HELPER_WORKSPACE=" + workspace(t),
		"HELPER_AGENT=" + testAgent,
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Dir = base
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{uint32(gid)}}}
	// A parallel test may fork while the copy's write fd is still open in the
	// child, which makes exec fail with ETXTBSY for a moment: retry briefly.
	var data []byte
	for attempt := 0; ; attempt++ {
		data, err = cmd.Output()
		if err == nil || !errors.Is(err, syscall.ETXTBSY) || attempt == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
		cmd = rebuild(cmd)
	}
	if err != nil {
		t.Fatalf("helper failed: %v", err)
	}
	var out helperOutcome
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("cannot decode helper output %q: %v", data, err)
	}
	return out
}

// rebuild returns a fresh copy of an exec.Cmd that failed to start.
func rebuild(c *exec.Cmd) *exec.Cmd {
	n := exec.Command(c.Path, c.Args[1:]...)
	n.Env, n.Dir, n.Stderr, n.SysProcAttr = c.Env, c.Dir, c.Stderr, c.SysProcAttr
	return n
}

func TestRunAsNonRootCutsTheNetworkOrFailsClosed(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	out := runAsNobody(t, "")
	if out.Reason != "" {
		if out.Reason != isolation.ReasonConfinement {
			t.Fatalf("got %q (%s), want a run or a confinement failure", out.Reason, out.Error)
		}
		t.Logf("the kernel refused a user namespace; the run failed closed: %s", out.Error)
		return
	}
	var r report
	if err := json.Unmarshal([]byte(out.Reply), &r); err != nil {
		t.Fatalf("cannot decode reply %q: %v", out.Reply, err)
	}
	uid, _ := nobody(t)
	if r.UID != uid {
		t.Errorf("agent ran as uid %d, want the scheduler's own %d", r.UID, uid)
	}
	if !slices.Equal(r.Interfaces, []string{"lo"}) {
		t.Errorf("interfaces %q, want only lo", r.Interfaces)
	}
}

func TestRunAsNonRootRefusesAnotherRunAsUser(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	out := runAsNobody(t, "daemon")
	if out.Reason != isolation.ReasonStart {
		t.Fatalf("got %q (%s), want %q", out.Reason, out.Error, isolation.ReasonStart)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
