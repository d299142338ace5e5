package hostrun_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/landlock"
)

// Runs yield the CPU (ADR 30): the berth-runs cgroup that holds every run
// gets [scheduler] runs_cpu_weight, read back from the real cgroup
// filesystem after a real run; the control shows the same run leaves the
// weight where it was when the write is taken away.
func TestARunGivesTheRunsCgroupTheConfiguredCPUWeight(t *testing.T) {
	// Not parallel: the weight is the package's, and the cgroup the host's.
	needCgroups(t)
	const weight = 7 // no one else's value: not systemd's 100, nor v1's 1024
	file, _ := hostrun.RunsCPUFile(weight)
	testenv.Need(t, file != "", "runs' cgroups have no cpu controller here")
	tests := []struct {
		name  string
		write bool
	}{
		{"The_run_writes_the_weight_to_berth-runs", true},
		{"Control_without_the_write_the_weight_stays_at_full", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The berth-runs cgroup is then this binary's own: on v1 the
			// cpu hierarchy's may be the host's, which other packages'
			// runs write their weight to at the same time.
			hostrun.WithRunsCPUWeight(t, weight, tc.write)
			file, want := hostrun.RunsCPUFile(weight)
			// berth-runs starts at the full weight of one task (v1
			// cpu.shares 1024, v2 cpu.weight 100), as before ADR 30; it
			// exists once any run made it.
			full := "1024"
			if filepath.Base(file) == "cpu.weight" {
				full = "100"
			}
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err == nil {
				_ = os.WriteFile(file, []byte(full), 0)
			}
			t.Cleanup(func() { _ = os.WriteFile(file, []byte(full), 0) })
			res, err := landlock.New().Run(context.Background(), landlockSpec(t, "/sh echo ran"))
			if err != nil || !strings.Contains(res.Response.Reply, "ran") {
				t.Fatalf("run: %v\nreply: %s\nstderr: %s", err, res.Response.Reply, res.Stderr)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(string(data))
			if tc.write && got != want {
				t.Errorf("%s = %s after a run, want %s (runs_cpu_weight %d)", file, got, want, weight)
			}
			if !tc.write && got != full {
				t.Errorf("%s = %s after a run without the write, want it left at %s", file, got, full)
			}
		})
	}
}
