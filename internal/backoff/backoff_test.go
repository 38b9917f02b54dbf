package backoff_test

import (
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/backoff"
)

func TestCeiling(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    backoff.Policy
		n    int
		want time.Duration
	}{
		{"first attempt waits at most the base", backoff.Policy{Base: time.Second, Cap: time.Minute}, 0, time.Second},
		{"each attempt doubles", backoff.Policy{Base: time.Second, Cap: time.Minute}, 3, 8 * time.Second},
		{"the cap bounds the doubling", backoff.Policy{Base: time.Second, Cap: time.Minute}, 6, time.Minute},
		{"zero value is the documented default", backoff.Policy{}, 0, backoff.DefaultBase},
		{"zero cap is the documented default", backoff.Policy{Base: time.Second}, 100, backoff.DefaultCap},
		{"a cap below the base bounds the first delay", backoff.Policy{Base: time.Minute, Cap: time.Second}, 0, time.Second},
		{"negative attempt counts as the first", backoff.Policy{Base: time.Second, Cap: time.Minute}, -1, time.Second},
		// base·2^n passes the range of time.Duration here: the delay must
		// stay at the cap, never wrap around to a negative one.
		{"large base after many attempts stays at the cap", backoff.Policy{Base: time.Minute, Cap: 5 * time.Minute}, 29, 5 * time.Minute},
		{"huge attempt count stays at the cap", backoff.Policy{Base: time.Hour, Cap: 24 * time.Hour}, 1 << 20, 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Ceiling(tc.n); got != tc.want {
				t.Fatalf("Ceiling(%d) = %v, want %v", tc.n, got, tc.want)
			}
		})
	}
}

// TestDelayFullJitter checks the delays fall in [0, ceiling] and use the
// whole range rather than clustering near the ceiling.
func TestDelayFullJitter(t *testing.T) {
	p := backoff.Policy{Base: 100 * time.Millisecond, Cap: time.Second}
	for n := range 40 {
		ceiling := p.Ceiling(n)
		var low, high bool
		for range 200 {
			d := p.Delay(n)
			if d < 0 || d > ceiling {
				t.Fatalf("Delay(%d) = %v, outside [0, %v]", n, d, ceiling)
			}
			low = low || d < ceiling/4
			high = high || d > ceiling*3/4
		}
		if !low || !high {
			t.Fatalf("Delay(%d): 200 draws never below a quarter or above three quarters of %v: not full jitter", n, ceiling)
		}
	}
}
