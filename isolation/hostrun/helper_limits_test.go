package hostrun_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// Where no cgroup can be made (and no systemd is asked), a run's helper
// cannot be confined: the caller hears so and fails the run closed.
func TestAHelperThatCannotBeConfinedIsAnError(t *testing.T) {
	testenv.NeedRoot(t)
	hostrun.OnlyCgroupsUnder(t, t.TempDir())
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	h, err := hostrun.ConfineHelper(context.Background(), "egress", "nocg", sleeper.Process.Pid, hostrun.Limits{MemoryMax: 64 << 20, TasksMax: 16, CPUQuotaPercent: 100}, false)
	if err == nil || !strings.Contains(err.Error(), "cannot limit the run's egress process") {
		t.Fatalf("ConfineHelper without cgroups = %+v, %v; want an error that says so", h, err)
	}
	if cg, _ := os.ReadFile("/proc/" + strconv.Itoa(sleeper.Process.Pid) + "/cgroup"); strings.Contains(string(cg), "nocg") {
		t.Errorf("the helper is in a cgroup of its own after all: %s", cg)
	}
}
