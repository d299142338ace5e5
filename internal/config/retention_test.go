package config_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

const day = 24 * time.Hour

func TestLoadFillsRetentionDefaultsKeyByKey(t *testing.T) {
	t.Parallel()
	defaults := config.Retention{FinishedRuns: 30 * day, RunsPerAgent: 10000, Delivered: 72 * time.Hour, IdleConversation: 30 * day}
	tests := []struct {
		name  string
		files map[string]string
		want  config.Retention
	}{
		{
			name:  "Without a retention table every default applies",
			files: map[string]string{"berth.toml": base},
			want:  defaults,
		},
		{
			name:  "An empty retention table keeps every default",
			files: map[string]string{"berth.toml": base + "\n[retention]\n"},
			want:  defaults,
		},
		{
			name:  "A key that is set replaces only its own default",
			files: map[string]string{"berth.toml": base + "\n[retention]\ndelivered_hours = 24\n"},
			want:  config.Retention{FinishedRuns: 30 * day, RunsPerAgent: 10000, Delivered: 24 * time.Hour, IdleConversation: 30 * day},
		},
		{
			name:  "Every key is read in its unit",
			files: map[string]string{"berth.toml": base + "\n[retention]\nfinished_runs_days = 1\nruns_per_agent = 1\ndelivered_hours = 100\nidle_conversation_days = 365\n"},
			want:  config.Retention{FinishedRuns: day, RunsPerAgent: 1, Delivered: 100 * time.Hour, IdleConversation: 365 * day},
		},
		{
			name: "A drop-in overrides one key and keeps what the main file set",
			files: map[string]string{
				"berth.toml":                base + "\n[retention]\nfinished_runs_days = 7\nruns_per_agent = 50\n",
				"berth.d/50-retention.toml": "[retention]\nruns_per_agent = 900\n",
			},
			want: config.Retention{FinishedRuns: 7 * day, RunsPerAgent: 900, Delivered: 72 * time.Hour, IdleConversation: 30 * day},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(writeConfig(t, tc.files))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !reflect.DeepEqual(c.Retention, tc.want) {
				t.Errorf("Retention = %+v, want %+v", c.Retention, tc.want)
			}
		})
	}
}

func TestLoadRefusesBadRetentionValuesNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{
			name:  "Delivered entries kept less than a day are refused because a platform may redeliver for a day",
			files: map[string]string{"berth.toml": base + "\n[retention]\ndelivered_hours = 12\n"},
			want:  []string{`berth.toml:10: retention.delivered_hours: must be at least 24, not 12: a platform may redeliver an event for a day, and a message id forgotten sooner would run it twice`},
		},
		{
			name:  "Zero days of finished runs are refused",
			files: map[string]string{"berth.toml": base + "\n[retention]\nfinished_runs_days = 0\n"},
			want:  []string{`berth.toml:10: retention.finished_runs_days: must be at least 1, not 0`},
		},
		{
			name:  "A negative number of runs per agent is refused",
			files: map[string]string{"berth.toml": base + "\n[retention]\nruns_per_agent = -5\n"},
			want:  []string{`berth.toml:10: retention.runs_per_agent: must be at least 1, not -5`},
		},
		{
			name:  "An idle conversation time beyond a century is refused",
			files: map[string]string{"berth.toml": base + "\n[retention]\nidle_conversation_days = 99999999\n"},
			want:  []string{`berth.toml:10: retention.idle_conversation_days: must be at most 36500, not 99999999`},
		},
		{
			name:  "A string where a number of days belongs is a wrong type",
			files: map[string]string{"berth.toml": base + "\n[retention]\nfinished_runs_days = \"30\"\n"},
			want:  []string{`berth.toml:10: retention.finished_runs_days: must be an integer, not a string`},
		},
		{
			name:  "A misspelt retention key is unknown",
			files: map[string]string{"berth.toml": base + "\n[retention]\nfinished_run_days = 3\n"},
			want:  []string{`berth.toml:10: retention.finished_run_days: unknown key (known keys: delivered_hours, finished_runs_days, idle_conversation_days, runs_per_agent)`},
		},
		{
			name: "A bad value in a drop-in names the drop-in",
			files: map[string]string{
				"berth.toml":        base + "\n[retention]\ndelivered_hours = 48\n",
				"berth.d/20-r.toml": "# shorter\n[retention]\ndelivered_hours = 1\n",
			},
			want: []string{`berth.d/20-r.toml:3: retention.delivered_hours: must be at least 24, not 1: a platform may redeliver an event for a day, and a message id forgotten sooner would run it twice`},
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
