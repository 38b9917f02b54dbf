package projector_test

import (
	"context"
	"sync"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
)

// countingThrottle grants every request and counts the records asked for.
type countingThrottle struct {
	mu      sync.Mutex
	records int
	tooBig  int
}

func (c *countingThrottle) WaitN(_ context.Context, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records += n
	if n > c.Burst() {
		c.tooBig++
	}
	return nil
}

func (c *countingThrottle) Burst() int { return 100 }

// Tokens alternates plenty and none, so that windows both grow and end
// early.
func (c *countingThrottle) Tokens() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.records%2 == 0 {
		return 1e9
	}
	return 0
}

// TestThrottleSeesEveryRecord runs a member far behind (its batches
// commit several together) with a throttle: every record it applies was
// asked of the throttle first, in requests within its burst, and the
// tables equal the reference fold. A generation being rebuilt is paced
// this way.
func TestThrottleSeesEveryRecord(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 2000
	b := setup(t, opts, 2)
	th := &countingThrottle{}
	run(t, b.engine(t, "throttled", projector.Config{Partition: partition.Config{Throttle: th, BatchMaxRecords: 200}}))
	b.verify(t, "throttled")
	th.mu.Lock()
	defer th.mu.Unlock()
	if th.records < len(b.records) {
		t.Errorf("the throttle was asked for %d records, the member applied all %d", th.records, len(b.records))
	}
	if th.tooBig > 0 {
		t.Errorf("%d requests above the throttle's burst", th.tooBig)
	}
}
