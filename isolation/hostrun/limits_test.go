package hostrun_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

func TestRunWithoutSystemdPutsTheAgentInItsCgroupWithRlimitsAsBeltAndBraces(t *testing.T) {
	t.Parallel()
	needCgroups(t)
	s := spec(t, "limits")
	s.Timeout = 90 * time.Second
	s.Limits = isolation.Limits{MemoryBytes: 300 << 20, Pids: 77, NanoCPUs: 500_000_000}
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	for _, want := range []string{
		`Max core file size\s+0\s+0\s+bytes`,
		`Max cpu time\s+90\s+90\s+seconds`,
		// The cgroup limits memory and processes, for the run as a whole.
		`Max data size\s+unlimited\s+unlimited\s+bytes`,
	} {
		if !regexp.MustCompile(want).MatchString(res.Response.Reply) {
			t.Errorf("agent's limits do not match %q:\n%s", want, res.Response.Reply)
		}
	}
}

func TestExplainSaysWhichLimitsOfThePlanHold(t *testing.T) {
	t.Parallel()
	p := isolation.Plan{RunID: "r1", Timeout: time.Minute, Limits: isolation.Limits{MemoryBytes: 1 << 30, Pids: 64, NanoCPUs: 500_000_000}}
	_, version := hostrun.RunCgroups("r1")
	cgroupHolds := map[int][]string{
		1: {"memory.limit_in_bytes=1073741824", "pids.max=64 (whole run)", "cpu.cfs_period_us=100000 cpu.cfs_quota_us=50000", "/berth-runs/r1.", "RLIMIT_CORE=0", "RLIMIT_CPU=60", `reason "out of memory"`, "every process in the run's cgroup is killed"},
		2: {"memory.max=1073741824", "pids.max=64", "cpu.max=50000 100000", "/berth-runs/r1.", "RLIMIT_CORE=0", "RLIMIT_CPU=60", `reason "out of memory"`, "every process in the run's cgroup is killed"},
	}
	tests := []struct {
		name    string
		systemd bool
		need    bool
		mode    string
		holds   []string
	}{
		{"Under_systemd_cgroup_limits_of_the_unit_hold_for_the_whole_run", true, true, "transient unit", []string{"MemoryMax=1073741824", "TasksMax=64", "CPUQuota=50%", "PrivateNetwork=yes"}},
		{"Without_systemd_the_runs_own_cgroup_holds_them", false, version != 0 && !hostrun.SystemdAvailable(), "process", cgroupHolds[version]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testenv.Need(t, tc.need, "no writable cgroup here (TestWithoutAWritableCgroupRunsFailClosedUnlessRlimitsAreAccepted covers such a machine)")
			c := hostrun.Runner{Systemd: func() bool { return tc.systemd }}.Explain(p)
			holds := strings.Join(c.Holds, "\n")
			if c.Mode != tc.mode {
				t.Errorf("mode %q, want %q", c.Mode, tc.mode)
			}
			for _, h := range tc.holds {
				if !strings.Contains(holds, h) {
					t.Errorf("holds lack %s:\n%s", h, holds)
				}
			}
			if strings.Contains(strings.Join(c.Missing, "\n"), "fail closed") {
				t.Errorf("Explain says runs fail closed where they do not: %q", c.Missing)
			}
		})
	}
}
