package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

func TestDurationReadsUnitsAndRefusesWhatIsNotALengthOfTime(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]time.Duration{"90s": 90 * time.Second, "30m": 30 * time.Minute, "1h30m": 90 * time.Minute, "0s": 0} {
		var d config.Duration
		if err := d.UnmarshalText([]byte(text)); err != nil || time.Duration(d) != want {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, time.Duration(d), err, want)
		}
		var back config.Duration
		if err := back.UnmarshalText([]byte(d.String())); err != nil || back != d {
			t.Errorf("%q written as %q reads back as %v, %v", text, d.String(), back, err)
		}
	}
	for _, bad := range []string{"", "10", "-1s", "1d", "soon"} {
		d := config.Duration(time.Second)
		err := d.UnmarshalText([]byte(bad))
		if err == nil || !strings.Contains(err.Error(), "want a number with a unit s, m or h") || d != config.Duration(time.Second) {
			t.Errorf("UnmarshalText(%q) = %v, %v; want an error and the value unchanged", bad, d, err)
		}
	}
}
