package hostrun

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// `berthctl sandbox explain` must say what hides the host's sockets and
// separates runs' IPC, in both modes, and say so when nothing does.
func TestSandboxExplainNamesTheNamespacesAndTheFilter(t *testing.T) {
	t.Parallel()
	egress := &isolation.EgressPlan{Socket: "/run/berth-test-egress/r1/egress.sock", SandboxSocket: "/run/berth-test-egress/r1/egress.sock", ProxyAddr: "127.0.0.1:3128"}
	tests := []struct {
		name        string
		policy      agentproto.Policy
		unit        bool
		wantHolds   []string
		wantMissing []string
	}{
		{"A_transient_unit_masks_run_with_a_tmpfs_and_has_private_IPC", agentproto.Policy{}, true,
			[]string{"TemporaryFileSystem=/run", "/tmp /var/tmp", "/tmp and /var/tmp: fresh tmpfs of the run's own (256m each", "bound back: /run/berth-test-egress/r1", "PrivateIPC=yes", "KeyringMode=private", "syscall filter", "keyctl, add_key, request_key"}, nil},
		{"A_plain_process_gets_mount_and_IPC_namespaces_of_its_own", agentproto.Policy{}, false,
			[]string{"mount namespace: /run", "/dev/shm", "/tmp and /var/tmp: fresh tmpfs of the run's own (256m each", "bound back: /run/berth-test-egress/r1", "IPC namespace of the run's own", "syscall filter"}, nil},
		{"An_unrestricted_run_says_it_has_none", agentproto.Policy{Unrestricted: true}, false,
			nil, []string{"mount namespace", "IPC namespace", "syscall filter"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := isolation.Plan{Workspace: "/var/lib/berth/agents/a", AgentBinary: "/usr/libexec/berth/berth-agent", Policy: tc.policy, Egress: egress}
			holds, missing := sandboxHolds(p, tc.unit)
			all := strings.Join(holds, "\n")
			for _, want := range tc.wantHolds {
				if !strings.Contains(all, want) {
					t.Errorf("holds lack %q:\n%s", want, all)
				}
			}
			if tc.wantHolds == nil && len(holds) > 0 {
				t.Errorf("an unrestricted run claims to hold %q", holds)
			}
			for _, want := range tc.wantMissing {
				if !slices.ContainsFunc(missing, func(m string) bool { return strings.HasPrefix(m, want) }) {
					t.Errorf("missing lacks %q: %q", want, missing)
				}
			}
		})
	}
}
