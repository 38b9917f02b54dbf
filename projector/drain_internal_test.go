package projector

import (
	"math"
	"testing"
	"time"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// The textbook case: 60,000 records behind, 400/s arriving and 600/s
// completed drain at 200/s, in 300 seconds; arrivals that keep up never
// let it drain, and no backlog drains at once.
func TestDrainSeconds(t *testing.T) {
	for _, tc := range []struct {
		backlog             int64
		arrival, completion float64
		want                float64
	}{
		{60_000, 400, 600, 300},
		{60_000, 600, 600, math.Inf(1)},
		{60_000, 700, 600, math.Inf(1)},
		{60_000, 0, 0, math.Inf(1)},
		{0, 400, 600, 0},
		{0, 700, 0, 0},
	} {
		if got := DrainSeconds(tc.backlog, tc.arrival, tc.completion); got != tc.want {
			t.Errorf("DrainSeconds(%d, %v/s arriving, %v/s completing) = %v, want %v", tc.backlog, tc.arrival, tc.completion, got, tc.want)
		}
	}
}

// The estimate takes its rates from the samples over the window, per
// topic: a partition this member did not hold at the window's start moves
// neither rate, though its backlog counts.
func TestDrainEstimate(t *testing.T) {
	d := newDrainEstimate(time.Minute)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := func(topic string, p int32, end, next int64) partition.Status {
		return partition.Status{TP: sinks.TP{Topic: topic, Partition: p}, HighWatermark: end, NextOffset: next}
	}
	d.sample(t0, []partition.Status{st("a", 0, 100_000, 40_000), st("b", 0, 10, 10), st("c", 0, -1, 0)})
	if got := d.estimates(); len(got) != 1 || got["b"] != 0 {
		t.Errorf("after one sample: %v, want only b (no backlog) at 0", got)
	}
	// A minute on: 24,000 arrived (400/s), 36,000 completed (600/s) on a/0;
	// a/1 arrived from another member with its own backlog of 6,000.
	d.sample(t0.Add(30*time.Second), []partition.Status{st("a", 0, 112_000, 58_000), st("b", 0, 10, 10)})
	d.sample(t0.Add(time.Minute), []partition.Status{st("a", 0, 124_000, 76_000), st("a", 1, 6_000, 0), st("b", 0, 20, 10)})
	got := d.estimates()
	// Backlog 48,000 + 6,000 = 54,000 at 200/s.
	if got["a"] != 270 {
		t.Errorf("a: %v s, want 270 (54,000 behind draining at 200/s)", got["a"])
	}
	if !math.IsInf(got["b"], 1) {
		t.Errorf("b: %v s, want +Inf (10 arrived, none completed)", got["b"])
	}
	// The window moves on: the first sample drops out.
	d.sample(t0.Add(2*time.Minute), []partition.Status{st("a", 0, 124_000, 124_000), st("b", 0, 20, 20)})
	got = d.estimates()
	if got["a"] != 0 || got["b"] != 0 {
		t.Errorf("caught up: %v, want 0 for both", got)
	}
}
