package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestReplyFileCapsDefaultAndAreReadAsSizes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		scheduler         string
		wantFile, wantAll int64
	}{
		{"Without_the_keys_a_file_may_be_25_MiB_and_a_reply_100_MiB", "", 25 << 20, 100 << 20},
		{"The_keys_take_sizes_as_memory_limits_do", "\n[scheduler]\nmax_reply_file_bytes = \"8m\"\nmax_reply_files_bytes = \"1g\"\n", 8 << 20, 1 << 30},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(writeConfig(t, map[string]string{"berth.toml": base + tc.scheduler}))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.Scheduler.MaxReplyFileBytes != tc.wantFile || c.Scheduler.MaxReplyFilesBytes != tc.wantAll {
				t.Errorf("caps = %d, %d; want %d, %d", c.Scheduler.MaxReplyFileBytes, c.Scheduler.MaxReplyFilesBytes, tc.wantFile, tc.wantAll)
			}
		})
	}
}

func TestLoadRefusesAReplyFileCapThatIsNoSize(t *testing.T) {
	t.Parallel()
	_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": base + "\n[scheduler]\nmax_reply_file_bytes = \"lots\"\n"}))
	if err == nil || !strings.Contains(err.Error(), "scheduler.max_reply_file_bytes") {
		t.Fatalf("Load = %v, want an error naming scheduler.max_reply_file_bytes", err)
	}
}
