// Package backoff is the one retry delay of projector: exponential backoff
// with full jitter, the delay before attempt n (0-based) drawn uniformly
// from [0, min(Cap, Base·2^n)].
//
// Full jitter spreads the retries of many partitions (or replicas) that
// failed at the same moment, so that a recovering Postgres or broker is not
// met by all of them at once. The package only computes delays; waiting,
// pausing fetches and logging stay with the caller, which knows what it is
// waiting for.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Defaults of a Policy's zero fields; they match the --retry-base and
// --retry-cap flags.
const (
	DefaultBase = 100 * time.Millisecond
	DefaultCap  = 30 * time.Second
)

// Policy is exponential backoff with full jitter. The zero value is
// DefaultBase and DefaultCap.
type Policy struct {
	// Base is the ceiling of the first delay; zero means DefaultBase.
	Base time.Duration
	// Cap bounds every delay; zero means DefaultCap. A Cap below Base
	// bounds the first delay too.
	Cap time.Duration
}

// Ceiling is the longest delay before attempt n (0-based):
// min(Cap, Base·2^n), computed without overflow for any n.
func (p Policy) Ceiling(n int) time.Duration {
	base, ceiling := p.Base, p.Cap
	if base <= 0 {
		base = DefaultBase
	}
	if ceiling <= 0 {
		ceiling = DefaultCap
	}
	if n < 0 {
		n = 0
	}
	// Doubling stops once it would pass the cap, so a large base or a
	// long run of attempts never wraps around to a negative delay.
	limit := base
	for range n {
		if limit >= ceiling/2 {
			return ceiling
		}
		limit *= 2
	}
	return min(ceiling, limit)
}

// Delay is the delay before attempt n (0-based), uniform in
// [0, Ceiling(n)].
func (p Policy) Delay(n int) time.Duration {
	return rand.N(p.Ceiling(n) + 1)
}
