package agent_test

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// sysprobe is isolation/landlock/testdata/sysprobe, built once into testDir.
var sysprobe struct {
	once sync.Once
	path string
	err  error
}

func sysprobeBinary(t *testing.T) string {
	t.Helper()
	sysprobe.once.Do(func() {
		// Static: it also runs in the agent's container image, which has no
		// dynamic loader.
		sysprobe.path, sysprobe.err = testenv.BuildStatic(testDir, "sysprobe", "../isolation/landlock/testdata/sysprobe")
	})
	if sysprobe.err != nil {
		t.Fatal(sysprobe.err)
	}
	return sysprobe.path
}

// A tool of a confined agent cannot use kernel keyrings (shared by every
// process of a uid, so one run could leave data for another) nor make
// namespaces; the same probe run outside berth-agent can, so the filter is
// what refuses. Ordinary tools — a pipeline, process groups, the nested
// launcher every tool starts through — keep working under it.
func TestToolsRunUnderTheSyscallFilter(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	probe := sysprobeBinary(t)
	tests := []struct {
		name    string
		command string
		want    []string
	}{
		{"Adding_a_key_to_any_keyring_is_refused_with_EPERM", "sysprobe addkey user; sysprobe addkey session; sysprobe addkey process",
			[]string{"addkey user refused: operation not permitted", "addkey session refused: operation not permitted", "addkey process refused: operation not permitted"}},
		{"Making_a_user_namespace_is_refused", "sysprobe userns; unshare -U true 2>&1; echo unshare=$?",
			[]string{"userns refused: fork/exec /bin/true: operation not permitted", "Operation not permitted", "unshare=1"}},
		{"A_pipeline_with_a_background_job_still_runs", "(sleep 0.1; echo late) & echo early | tr a-z A-Z; wait; echo done", []string{"EARLY\n", "late\n", "done\n", "[exit code 0]"}},
	}
	for _, as := range users(t) {
		for _, tc := range tests {
			t.Run(as.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				f := openFixture(t, as)
				req := f.hostRequest("/sh " + strings.ReplaceAll(tc.command, "sysprobe ", probe+" "))
				req.Policy.AllowRead = append(req.Policy.AllowRead, probe)
				res := runAgentAs(t, req, as)
				res.expect(t, agentproto.ExitOK, tc.want...)
				if strings.Contains(res.resp.Reply, " ok\n") {
					t.Errorf("a probe got through the filter:\n%s", res.resp.Reply)
				}
			})
		}
	}
}

// The control: outside berth-agent the probes that the filter refuses
// succeed, so the test above fails when the filter is gone.
func TestTheSyscallProbesWorkOutsideTheSandbox(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	probe := sysprobeBinary(t)
	nobody := users(t)[0]
	for _, args := range [][]string{{"addkey", "process"}, {"userns"}} {
		cmd := exec.Command(probe, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(nobody.uid), Gid: uint32(nobody.gid)}}
		out, err := cmd.Output()
		if err != nil || !strings.HasSuffix(string(out), " ok\n") {
			t.Errorf("sysprobe %s outside the sandbox: %q (%v), want ok", strings.Join(args, " "), out, err)
		}
	}
	cmd := exec.Command("unshare", "-U", "true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(nobody.uid), Gid: uint32(nobody.gid)}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("unshare -U outside the sandbox: %q (%v), want it to work", out, err)
	}
}
