package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The OOM counter is found where each kind of sandbox shows its cgroup: a
// v1 container sees its own cgroup at the mount point, a v2 container (a
// cgroup namespace) sees "/", a host run sees its path under the root, and
// a hybrid host counts in v1's memory controller, not the empty unified
// hierarchy.
func TestTheOOMCounterIsFoundInEveryCgroupLayout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, cgroup, mounts, want, wantErr string
	}{
		{"A_v1_container_sees_its_cgroup_at_the_mount_point",
			"12:memory:/docker/abc\n11:pids:/docker/abc\n0::/\n",
			"35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
			"/sys/fs/cgroup/memory/memory.oom_control", ""},
		{"A_v2_container_in_its_own_cgroup_namespace_sees_the_root",
			"0::/\n",
			"30 25 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n",
			"/sys/fs/cgroup/memory.events", ""},
		{"A_v2_host_run_is_under_the_root",
			"0::/berth-runs/r1/agent\n",
			"30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
			"/sys/fs/cgroup/berth-runs/r1/agent/memory.events", ""},
		{"A_hybrid_host_counts_in_the_v1_memory_controller",
			"4:memory:/berth-runs/r1\n0::/\n",
			"35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
			"/sys/fs/cgroup/memory/berth-runs/r1/memory.oom_control", ""},
		{"A_cgroup_the_mount_does_not_show_is_refused",
			"4:memory:/other\n",
			"35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			"", "is not visible under /sys/fs/cgroup/memory"},
		{"No_memory_hierarchy_is_refused",
			"1:pids:/\n",
			"36 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n",
			"", "no cgroup filesystem with a memory controller"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cgroup, mounts := filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo")
			if err := os.WriteFile(cgroup, []byte(tc.cgroup), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(mounts, []byte(tc.mounts), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := oomCounterPath(cgroup, mounts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("oomCounterPath = %q, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("oomCounterPath = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// The counter is read again through the descriptor opened at the start, so
// a rise after confinement is seen; a file without the line is an error.
func TestTheOOMCounterIsReadAgainThroughItsDescriptor(t *testing.T) {
	t.Parallel()
	name := filepath.Join(t.TempDir(), "memory.events")
	if err := os.WriteFile(name, []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &oomCounter{file: f, key: "oom_kill"}
	base := c.now()
	if base != 1 {
		t.Fatalf("counter = %d, want 1", base)
	}
	if err := os.WriteFile(name, []byte("low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := c.since(base); got != 2 {
		t.Fatalf("since = %d, want 2", got)
	}
	if err := os.WriteFile(name, []byte("low 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.count(); err == nil || !strings.Contains(err.Error(), "has no oom_kill line") {
		t.Fatalf("count of a file without oom_kill: %v", err)
	}
	var none *oomCounter
	if none.since(0) != 0 || none.now() != 0 {
		t.Fatal("a missing counter counts something")
	}
}
