package projector

import (
	"math"
	"sync"
	"time"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// Lag says how far behind a topic is, not whether it is catching up: a
// backlog of a million records shrinking by a thousand a second is
// healthier than one of ten thousand that grows. The engine therefore
// estimates, per topic of its own partitions, how long the backlog takes
// to drain at the rates it has seen over the last DrainWindow: the
// records behind divided by how much faster records are committed than
// they arrive. Arrivals are the advance of the partitions' log end
// (high watermark), completions that of their stored next offset, both
// summed over the partitions this member ran at both ends of the window,
// so that a partition gained or lost in a rebalance moves neither rate.

// DrainWindow is the span over which the arrival and completion rates of
// projector_backlog_drain_seconds are measured.
const DrainWindow = 2 * time.Minute

// DrainSeconds is how long a backlog of records takes to drain when
// records arrive at arrival per second and are completed at completion
// per second: 0 without a backlog, +Inf while arrivals keep up with
// completions (the backlog never shrinks).
func DrainSeconds(backlog int64, arrival, completion float64) float64 {
	if backlog <= 0 {
		return 0
	}
	if completion <= arrival {
		return math.Inf(1)
	}
	return float64(backlog) / (completion - arrival)
}

// drainSample is where one partition stood at a sample.
type drainSample struct{ end, next int64 }

type drainPoint struct {
	at    time.Time
	parts map[sinks.TP]drainSample
}

// drainEstimate keeps the samples of the last window and the estimate
// made from them, by topic.
type drainEstimate struct {
	window time.Duration
	mu     sync.Mutex
	points []drainPoint // oldest first
	est    map[string]float64
}

func newDrainEstimate(window time.Duration) *drainEstimate {
	return &drainEstimate{window: window, est: map[string]float64{}}
}

// sample records where the workers stand at now and estimates each
// topic's drain time from the oldest sample still in the window.
func (d *drainEstimate) sample(now time.Time, workers []partition.Status) {
	cur := drainPoint{at: now, parts: map[sinks.TP]drainSample{}}
	backlog := map[string]int64{}
	for _, s := range workers {
		if s.HighWatermark < 0 {
			continue // the log end is not known yet
		}
		cur.parts[s.TP] = drainSample{end: s.HighWatermark, next: s.NextOffset}
		backlog[s.Topic] += max(0, s.HighWatermark-s.NextOffset)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// Samples are kept a twentieth of the window apart, and one at least
	// a window old, so that the rates span the whole window once it has
	// passed.
	if n := len(d.points); n == 0 || now.Sub(d.points[n-1].at) >= d.window/20 {
		d.points = append(d.points, cur)
	}
	for len(d.points) > 2 && now.Sub(d.points[1].at) >= d.window {
		d.points = d.points[1:]
	}
	first := d.points[0]
	dt := now.Sub(first.at).Seconds()
	est := map[string]float64{}
	if dt <= 0 {
		for t, b := range backlog {
			if b == 0 {
				est[t] = 0
			}
		}
		d.est = est
		return
	}
	arrived, completed := map[string]int64{}, map[string]int64{}
	for tp, c := range cur.parts {
		if p, ok := first.parts[tp]; ok {
			arrived[tp.Topic] += c.end - p.end
			completed[tp.Topic] += c.next - p.next
		}
	}
	for t, b := range backlog {
		est[t] = DrainSeconds(b, float64(arrived[t])/dt, float64(completed[t])/dt)
	}
	d.est = est
}

// estimates returns the last estimate of each topic; a topic sampled only
// once has none unless it has no backlog.
func (d *drainEstimate) estimates() map[string]float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.est
}
