package intake

import (
	"testing"
	"time"
)

func TestRetryDelayDoublesUpToItsCapWithJitter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		attempts int
		want     time.Duration
	}{
		{"First_retry_waits_about_250ms", 1, 250 * time.Millisecond},
		{"Third_retry_waits_about_1s", 3, time.Second},
		{"Tenth_retry_is_capped_at_about_30s", 10, 30 * time.Second},
		{"Thousandth_retry_is_still_capped", 1000, 30 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for range 100 {
				d := defaultRetryDelay.Delay(tc.attempts)
				if d > tc.want || d < tc.want*3/4 {
					t.Fatalf("delay(%d) = %v, want within [%v, %v]", tc.attempts, d, tc.want*3/4, tc.want)
				}
			}
		})
	}
}
