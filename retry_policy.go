package outboxplugin

import (
	"math/rand/v2"
	"time"
)

// RetryPolicy decides how long an event waits before its next delivery after a failed one.
type RetryPolicy interface {
	// Backoff returns the wait after the failure of delivery number attempt (1 for the first).
	Backoff(attempt int) time.Duration
}

// ExponentialBackoff waits Base after the first failure and doubles the wait after each further one,
// up to Max, spreading each wait at random by ±Jitter (a fraction: 0.2 is ±20%), so that events that
// failed together do not all come back together.
type ExponentialBackoff struct {
	Base   time.Duration
	Max    time.Duration
	Jitter float64
}

// DefaultRetryPolicy is the worker's retry policy unless WithRetryPolicy sets another: 1 s, 2 s,
// 4 s, … up to 5 minutes, ±20%.
var DefaultRetryPolicy RetryPolicy = ExponentialBackoff{Base: time.Second, Max: 5 * time.Minute, Jitter: 0.2}

// Backoff implements RetryPolicy.
func (b ExponentialBackoff) Backoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := b.Base
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	if b.Max > 0 && d > b.Max {
		d = b.Max
	}
	if b.Jitter > 0 {
		d = time.Duration(float64(d) * (1 + b.Jitter*(2*rand.Float64()-1)))
	}
	if d < 0 {
		d = 0
	}
	return d
}
