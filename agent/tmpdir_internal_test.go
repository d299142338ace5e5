package agent

import (
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

// A run whose runner gave it a /tmp of its own (read-write in its policy:
// a confined host run, a container) keeps the tools' temporary files there;
// an unrestricted run shares the host's /tmp and keeps them in the workspace.
func TestToolsTmpDirIsTheRunsOwnTmpWhereItHasOne(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy agentproto.Policy
		want   string
	}{
		{"A_confined_run_with_its_own_tmp_uses_it", agentproto.Policy{AllowReadWrite: []string{"/ws", "/tmp/", "/var/tmp"}}, "/tmp"},
		{"A_confined_run_without_tmp_uses_the_workspace", agentproto.Policy{AllowReadWrite: []string{"/ws"}}, "/ws/.tmp"},
		{"An_unrestricted_run_uses_the_workspace", agentproto.Policy{Unrestricted: true, AllowReadWrite: []string{"/tmp"}}, "/ws/.tmp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := toolsTmpDir(agentproto.Request{Workspace: "/ws", Policy: tc.policy}); got != tc.want {
				t.Errorf("toolsTmpDir = %q, want %q", got, tc.want)
			}
		})
	}
}
