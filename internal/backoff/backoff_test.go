package backoff_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/backoff"
)

func TestDelayDoublesUpToItsCapLessItsJitter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		policy   backoff.Policy
		attempts int
		want     time.Duration
	}{
		{"First_attempt_waits_the_minimum", backoff.Policy{Min: time.Second, Max: 8 * time.Second}, 1, time.Second},
		{"Zero_attempts_count_as_one", backoff.Policy{Min: time.Second, Max: 8 * time.Second}, 0, time.Second},
		{"Third_attempt_waits_four_times_the_minimum", backoff.Policy{Min: time.Second, Max: 8 * time.Second}, 3, 4 * time.Second},
		{"Many_attempts_wait_the_maximum", backoff.Policy{Min: time.Second, Max: 8 * time.Second}, 1000, 8 * time.Second},
		{"A_quarter_jitter_takes_off_at_most_a_quarter", backoff.Policy{Min: time.Second, Max: 8 * time.Second, Jitter: 0.25}, 2, 2 * time.Second},
		{"A_half_jitter_takes_off_at_most_half", backoff.Policy{Min: time.Second, Max: 30 * time.Second, Jitter: 0.5}, 6, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			floor := tt.want - time.Duration(float64(tt.want)*tt.policy.Jitter)
			seen := map[time.Duration]bool{}
			for range 200 {
				d := tt.policy.Delay(tt.attempts)
				if d < floor || d > tt.want {
					t.Fatalf("Delay(%d) = %s, want within [%s, %s]", tt.attempts, d, floor, tt.want)
				}
				seen[d] = true
			}
			if jittered := len(seen) > 1; jittered != (tt.policy.Jitter > 0) {
				t.Errorf("200 delays took %d values (%s), want jitter %v", len(seen), fmt.Sprint(seen), tt.policy.Jitter)
			}
		})
	}
}

func TestCheckRefusesBoundsThatCannotMakeADelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		policy  backoff.Policy
		wantErr bool
	}{
		{"Minimum_below_maximum_is_fine", backoff.Policy{Min: time.Second, Max: time.Minute}, false},
		{"Equal_bounds_are_fine", backoff.Policy{Min: time.Second, Max: time.Second}, false},
		{"Error_when_the_maximum_is_below_the_minimum", backoff.Policy{Min: time.Minute, Max: time.Second}, true},
		{"Error_when_the_minimum_is_negative", backoff.Policy{Min: -time.Second, Max: time.Second}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.policy.Check(); (err != nil) != tt.wantErr {
				t.Errorf("Check() = %v, want an error: %v", err, tt.wantErr)
			}
		})
	}
}
