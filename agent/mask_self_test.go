package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/hostsandbox"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// berth-agent masks the host's socket directories only in a user and mount
// namespace of its own (what a non-root scheduler makes for it). Asked to
// mask anywhere else it refuses to run — exit 3, nothing ran — and the
// host's /run is left as it was: a root agent started by hand with the
// variable set must not hide /run from the whole machine.
func TestMaskingOutsideANamespaceOfItsOwnFailsClosed(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	host, err := os.CreateTemp("/run", "berth-test-host-file-")
	if err != nil {
		t.Fatal(err)
	}
	hostFile := host.Name()
	host.Close()
	t.Cleanup(func() { os.Remove(hostFile) })
	for _, as := range users(t) {
		t.Run(as.name, func(t *testing.T) {
			t.Parallel()
			f := openFixture(t, as)
			marker := filepath.Join(f.workspace, "ran")
			stdin, err := json.Marshal(f.hostRequest("/sh touch " + marker))
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(agentBinary)
			cmd.Env = []string{"PATH=/usr/bin:/bin", hostsandbox.MaskEnv + "=1"}
			cmd.Stdin = bytes.NewReader(stdin)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(as.uid), Gid: uint32(as.gid)}}
			err = cmd.Run()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != agentproto.ExitConfinement {
				t.Fatalf("berth-agent ended with %v, want exit %d\nstderr: %s", err, agentproto.ExitConfinement, stderr.String())
			}
			if !strings.Contains(stderr.String(), "not in a user namespace of its own") {
				t.Errorf("stderr does not say why: %s", stderr.String())
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("a tool ran although the masks were refused")
			}
			if _, err := os.Stat(hostFile); err != nil {
				t.Errorf("the host's /run lost %s: %v", hostFile, err)
			}
		})
	}
}

// A non-root scheduler starts berth-agent in user, mount and IPC namespaces
// of its own with CAP_SYS_ADMIN there: the agent masks the host's socket
// directories itself, so a tool cannot even see a file of the host's /run,
// while what its policy allows beneath /run is bound back and readable.
func TestANonRootAgentMasksTheHostsSocketsItselfAndKeepsItsOwnPaths(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	host, err := os.CreateTemp("/run", "berth-test-host-file-")
	if err != nil {
		t.Fatal(err)
	}
	hostFile := host.Name()
	host.Close()
	t.Cleanup(func() { os.Remove(hostFile) })
	kept, err := os.MkdirTemp("/run", "berth-test-kept-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(kept) })
	if err := os.Chmod(kept, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(kept, "kept.txt"), "kept notes\n")
	nobody := users(t)[0]
	f := openFixture(t, nobody)
	req := f.hostRequest("/sh cat " + filepath.Join(kept, "kept.txt") + "; test -e " + hostFile + "; echo host=$?")
	req.Policy.AllowRead = append(req.Policy.AllowRead, kept)
	stdin, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBinary)
	cmd.Env = []string{"PATH=/usr/bin:/bin", hostsandbox.MaskEnv + "=1"}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: uint32(nobody.uid), Gid: uint32(nobody.gid)},
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: nobody.uid, HostID: nobody.uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: nobody.gid, HostID: nobody.gid, Size: 1}},
		AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN},
	}
	if err := cmd.Run(); err != nil {
		t.Fatalf("berth-agent: %v\nstderr: %s", err, stderr.String())
	}
	var resp agentproto.Response
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		t.Fatalf("stdout is not a response: %v\n%s", err, stdout.String())
	}
	for _, want := range []string{"kept notes\n", "host=1\n"} {
		if !strings.Contains(resp.Reply, want) {
			t.Errorf("the tool's output lacks %q (the host's /run hidden, the allowed path kept):\n%s\nstderr: %s", want, resp.Reply, stderr.String())
		}
	}
}
