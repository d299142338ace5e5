package hostrun_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testenv"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

func TestRunWithoutSystemdHoldsTheAgentToRlimits(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	// Under systemd runs are transient units instead; the install test covers those.
	testenv.Need(t, !hostrun.SystemdAvailable(), "this test needs a machine where systemd is not PID 1")
	s := spec(t, "limits")
	s.Timeout = 90 * time.Second
	s.Limits = isolation.Limits{MemoryBytes: 300 << 20, Pids: 77, NanoCPUs: 500_000_000}
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v (stderr %q)", err, res.Stderr)
	}
	for _, want := range []string{
		`Max data size\s+314572800\s+314572800\s+bytes`,
		`Max processes\s+77\s+77\s+processes`,
		`Max core file size\s+0\s+0\s+bytes`,
		`Max cpu time\s+90\s+90\s+seconds`,
	} {
		if !regexp.MustCompile(want).MatchString(res.Response.Reply) {
			t.Errorf("agent's limits do not match %q:\n%s", want, res.Response.Reply)
		}
	}
	c := hostrun.Runner{}.Explain(s.Plan)
	if c.Mode != "process" || !strings.Contains(strings.Join(c.Holds, "\n"), "RLIMIT_DATA=314572800") || len(c.Missing) == 0 {
		t.Errorf("Explain = %+v, want mode process, RLIMIT_DATA among the limits that hold and what does not hold", c)
	}
}

func TestExplainSaysWhichLimitsOfThePlanHold(t *testing.T) {
	t.Parallel()
	p := isolation.Plan{Timeout: time.Minute, Limits: isolation.Limits{MemoryBytes: 1 << 30, Pids: 64, NanoCPUs: 500_000_000}}
	tests := []struct {
		name    string
		systemd bool
		mode    string
		holds   []string
		missing string
	}{
		{"Under_systemd_cgroup_limits_hold_for_the_whole_run", true, "transient unit", []string{"MemoryMax=1073741824", "TasksMax=64", "CPUQuota=50%", "PrivateNetwork=yes"}, ""},
		{"Without_systemd_only_rlimits_hold", false, "process", []string{"RLIMIT_DATA=1073741824", "RLIMIT_NPROC=64", "RLIMIT_CPU=60"}, "MemoryMax: RLIMIT_DATA limits each process"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
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
			if tc.missing != "" && !strings.Contains(strings.Join(c.Missing, "\n"), tc.missing) {
				t.Errorf("missing lacks %q: %q", tc.missing, c.Missing)
			}
		})
	}
}
