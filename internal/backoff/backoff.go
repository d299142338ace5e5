// Package backoff computes how long to wait before retrying: a capped
// exponential delay with jitter. It only computes; callers wait on their own
// (injected) clocks.
package backoff

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is a retry delay that starts at Min and doubles per failed attempt up
// to Max.
type Policy struct {
	Min, Max time.Duration
	// Jitter is the share of the delay taken off at random, from 0 (none) to
	// 1, so that many clients retrying together spread out: 0.25 gives a
	// wait between 75% and 100% of the doubled delay.
	Jitter float64
}

// Delay returns the wait after the given number of failed attempts (1 or
// more; less counts as 1).
func (p Policy) Delay(attempts int) time.Duration {
	d := p.Min
	for i := 1; i < attempts && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	if cut := int64(float64(d) * min(max(p.Jitter, 0), 1)); cut > 0 {
		d -= time.Duration(rand.Int64N(cut + 1))
	}
	return d
}

// Check refuses bounds that cannot make a delay: a negative minimum, or a
// maximum below the minimum.
func (p Policy) Check() error {
	if p.Min < 0 || p.Max < p.Min {
		return fmt.Errorf("cannot use back-off bounds %s and %s: they must be 0 <= minimum <= maximum", p.Min, p.Max)
	}
	return nil
}
