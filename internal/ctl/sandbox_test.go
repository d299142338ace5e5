package ctl_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/ctl"
)

func TestSandboxExplainShowsTheEffectiveIsolationAndWhy(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "berth.toml")
	cfg := `[[agents]]
id = "boxed"
[agents.container_mode]
enabled = true
network = "none"
memory_limit = "256m"
runtime = "runc"
binds = ["/srv/data:/data:ro"]
warm = 2

[[agents]]
id = "ops"
[agents.file_access]
allow_read = ["/var/log"]
`
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		agent string
		code  int
		want  []string
	}{
		{"A_container_agent_shows_image_limits_network_mounts_user_and_runtime", "boxed", ctl.ExitOK, []string{
			"backend:   container — container_mode.enabled = true", "image:     berth-agent:<content hash>",
			"runtime:   runc", "memory 256m with no extra swap, 256 pids, 1 CPU", "network:   none",
			"→ /workspace", "tmpfs /tmp", "/srv/data:/data:ro", "user:      uid:gid of berth-agent",
			"warm:      2 started container(s) kept waiting on stdin"}},
		{"A_landlock_agent_shows_its_file_access", "ops", ctl.ExitOK, []string{
			"backend:   landlock", "/var/log read-only (file_access.allow_read)",
			"limits:", "holds: NoNewPrivileges",
			"policy:    read-write: /var/lib/berth/scheduler/agents/ops", "read-only:  /usr", "/var/log"}},
		{"An_unknown_agent_fails", "nope", ctl.ExitFailed, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			if code := ctl.Main([]string{"sandbox", "explain", "--config", path, tc.agent}, &out, &errOut); code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out.String(), errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
