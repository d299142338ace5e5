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

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testenv"
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
			cmd.Env = []string{"PATH=/usr/bin:/bin", confine.MaskEnv + "=1"}
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
