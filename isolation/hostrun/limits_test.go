package hostrun_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testenv"

	"github.com/berth-dev/berth/isolation/hostrun"
)

func TestRunWithoutSystemdHoldsTheAgentToRlimits(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	// Under systemd runs are transient units instead; the install test covers those.
	testenv.Need(t, !hostrun.SystemdAvailable(), "this test needs a machine where systemd is not PID 1")
	s := spec(t, "limits")
	s.Timeout = 90 * time.Second
	r := hostrun.Runner{Limits: hostrun.Limits{MemoryMax: 300 << 20, TasksMax: 77, CPUQuotaPercent: 50}}
	res, err := r.Run(context.Background(), s)
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
	c := r.Explain(s.Timeout, false)
	if c.Mode != "process" || !strings.Contains(strings.Join(c.Holds, "\n"), "RLIMIT_DATA=314572800") || len(c.Missing) == 0 {
		t.Errorf("Explain = %+v, want mode process, RLIMIT_DATA among the limits that hold and what does not hold", c)
	}
}
