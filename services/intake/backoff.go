package intake

import (
	"math/rand/v2"
	"time"
)

// backoff is a capped exponential delay with jitter.
type backoff struct {
	min, max time.Duration
}

var defaultBackoff = backoff{min: 250 * time.Millisecond, max: 30 * time.Second}

// delay returns the wait after the given number of failed attempts (1 or
// more): min doubling up to max, then a random cut of up to a quarter so that
// many retries spread out instead of hitting the target together.
func (b backoff) delay(attempts int) time.Duration {
	d := b.min
	for i := 1; i < attempts && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	if q := int64(d / 4); q > 0 {
		d -= time.Duration(rand.Int64N(q + 1))
	}
	return d
}
