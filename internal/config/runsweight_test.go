package config_test

import (
	"reflect"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestRunsCPUWeightDefaultsLowAndIsReadFromTheSchedulerTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  int
	}{
		{"Without the key runs get a fifth of a service's weight", map[string]string{"berth.toml": base}, config.DefaultRunsCPUWeight},
		{"The key sets the weight", map[string]string{"berth.toml": base + "\n[scheduler]\nruns_cpu_weight = 5\n"}, 5},
		{"The largest weight is accepted", map[string]string{"berth.toml": base + "\n[scheduler]\nruns_cpu_weight = 10000\n"}, 10000},
		{"A drop-in overrides the main file", map[string]string{
			"berth.toml":          base + "\n[scheduler]\nruns_cpu_weight = 50\n",
			"berth.d/50-cpu.toml": "[scheduler]\nruns_cpu_weight = 100\n",
		}, 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(writeConfig(t, tc.files))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := c.Scheduler.RunsCPUWeight; got != tc.want {
				t.Errorf("RunsCPUWeight = %d, want %d", got, tc.want)
			}
		})
	}
	if config.DefaultRunsCPUWeight >= 100 {
		t.Errorf("the default runs_cpu_weight %d does not yield to an ordinary service (100)", config.DefaultRunsCPUWeight)
	}
}

func TestLoadRefusesABadRunsCPUWeightNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{
			name:  "Zero would starve the runs and is not a weight",
			files: map[string]string{"berth.toml": base + "\n[scheduler]\nruns_cpu_weight = 0\n"},
			want:  []string{`berth.toml:10: scheduler.runs_cpu_weight: must be a CPU weight from 1 to 10000 (100 is an ordinary service's), not 0`},
		},
		{
			name:  "Above cgroup v2's largest weight is refused",
			files: map[string]string{"berth.toml": base + "\n[scheduler]\nruns_cpu_weight = 10001\n"},
			want:  []string{`berth.toml:10: scheduler.runs_cpu_weight: must be a CPU weight from 1 to 10000 (100 is an ordinary service's), not 10001`},
		},
		{
			name:  "A string is a wrong type",
			files: map[string]string{"berth.toml": base + "\n[scheduler]\nruns_cpu_weight = \"low\"\n"},
			want:  []string{`berth.toml:10: scheduler.runs_cpu_weight: must be an integer, not a string`},
		},
		{
			name: "A bad weight in a drop-in names the drop-in",
			files: map[string]string{
				"berth.toml":          base + "\n[scheduler]\nruns_cpu_weight = 20\n",
				"berth.d/50-cpu.toml": "# all runs\n[scheduler]\nruns_cpu_weight = -1\n",
			},
			want: []string{`berth.d/50-cpu.toml:3: scheduler.runs_cpu_weight: must be a CPU weight from 1 to 10000 (100 is an ordinary service's), not -1`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, tc.files)
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", tc.want)
			}
			if got := errorLines(t, err, path); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Load errors:\n%s\nwant:\n%s", join(got), join(tc.want))
			}
		})
	}
}
