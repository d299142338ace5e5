package hostrun

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/mountinfo"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

func TestTheSchedulersCgroupIsFoundUnderTheMountThatShowsIt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		m       mountinfo.Mount
		rel     string
		want    string
		wantErr bool
	}{
		{"A_host_mount_shows_the_whole_hierarchy", mountinfo.Mount{Root: "/", Point: "/sys/fs/cgroup/memory"}, "/process_api/abc", "/sys/fs/cgroup/memory/process_api/abc", false},
		{"A_container_mount_starts_at_the_containers_cgroup", mountinfo.Mount{Root: "/docker/c1", Point: "/sys/fs/cgroup/memory"}, "/docker/c1/app", "/sys/fs/cgroup/memory/app", false},
		{"A_mount_point_with_a_space_is_unescaped", mountinfo.Mount{Root: "/", Point: mountinfo.Unescape(`/mnt/cg\040v2`)}, "/a", "/mnt/cg v2/a", false},
		{"A_cgroup_outside_the_mount_is_refused", mountinfo.Mount{Root: "/docker/c1", Point: "/sys/fs/cgroup/memory"}, "/docker/c2", "", true},
		{"No_cgroup_is_refused", mountinfo.Mount{Root: "/", Point: "/sys/fs/cgroup"}, "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ownDir(tc.m, tc.rel)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ownDir = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// startInCgroup starts a shell that, once in dir, starts two sleeps.
func startInCgroup(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read go; sleep 300 & sleep 300 & wait")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := writeCgroup(dir, "cgroup.procs", strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		pids, err := procsOf(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 3 {
			return cmd
		}
	}
	t.Fatalf("the shell in %s did not start its sleeps", dir)
	return nil
}

// The v2 hierarchy here may have no controllers, but cgroup.kill and the
// cgroup's life are the kernel's all the same.
func TestCgroupKillEndsEveryProcessOfACgroupV2AndTheCgroupGoes(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" })
	testenv.Need(t, i >= 0, "no cgroup v2 hierarchy is mounted")
	member, err := selfCgroups()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ownDir(mounts[i], member[""])
	if err != nil {
		t.Fatal(err)
	}
	testenv.Need(t, exists(filepath.Join(own, "cgroup.kill")) || own == mounts[i].Point, "this kernel has no cgroup.kill")
	dir := filepath.Join(own, cgroupName("kill-test", os.Getpid()))
	testenv.Need(t, os.Mkdir(dir, 0o755) == nil, "cannot make a cgroup v2 under %s", own)
	t.Cleanup(func() { _ = removeCgroup(2, dir) })
	cmd := startInCgroup(t, dir)

	killCgroup(2, dir, "")
	if pids, _ := procsOf(dir); slices.ContainsFunc(pids, running) {
		t.Fatalf("processes %v still run in %s after the kill", pids, dir)
	}
	_ = cmd.Wait()
	if err := removeCgroup(2, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there: %v", dir, err)
	}
}

func TestRunCgroupsLeftByASchedulerThatIsGoneAreRemovedAndOthersKept(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	host, err := probeCgroups()
	testenv.Need(t, err == nil, "no writable cgroup: %v", err)
	p := host.parents[0]
	if host.version == 2 {
		if err := v2Prepare(host, p); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Mkdir(p.dir(), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	// A pid that was used and is gone now.
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	// A parent of the test's own, named without an owner: schedulers of
	// other test processes clean berth-runs too, and would remove the
	// leftover (rightly) before this test could look.
	parent := filepath.Join(p.dir(), "leftovers-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroup(host.version, parent) })
	leftover := filepath.Join(parent, cgroupName("leftover", dead.Process.Pid))
	mine := filepath.Join(parent, cgroupName("mine", os.Getpid()))
	live := filepath.Join(parent, cgroupName("live", os.Getppid()))
	for _, d := range []string{leftover, mine, live} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = removeCgroup(host.version, d) })
	}
	cmd := startInCgroup(t, leftover)

	removeLeftovers(host.version, parent)
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the left-over run cgroup %s is still there: %v", leftover, err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the process left in the cgroup was not killed")
	}
	for _, d := range []string{mine, live} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("the run cgroup %s of a live scheduler was removed: %v", d, err)
		}
	}
}
