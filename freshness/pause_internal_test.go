package freshness

import (
	"testing"
	"time"
)

// TestPauseBoundsTheReadingShare: after a round that took no more than a
// tenth of Poll the next comes a Poll after the last began; after a long
// one, late enough that reading beyond that tenth stays within Share of
// the time.
func TestPauseBoundsTheReadingShare(t *testing.T) {
	w := &Watcher{cfg: Config{Poll: 10 * time.Millisecond, Share: 0.02}}
	for _, took := range []time.Duration{0, 500 * time.Microsecond, time.Millisecond} {
		if got := w.pause(took); got != 10*time.Millisecond-took {
			t.Errorf("after a round of %v: pause %v, want %v", took, got, 10*time.Millisecond-took)
		}
	}
	for _, took := range []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 30 * time.Millisecond, time.Second} {
		pause := w.pause(took)
		share := float64(took-time.Millisecond) / float64(took+pause)
		if share > 0.0201 || share < 0.0199 {
			t.Errorf("after a round of %v: pause %v, reading %.4f of the time beyond the free millisecond, want 0.02", took, pause, share)
		}
	}
}
