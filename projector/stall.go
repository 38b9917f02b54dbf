package projector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// A worker that has records to apply and commits nothing for
// Partition.StallAfter (see partition.Status.Stalled) is stuck in a way
// retrying will not mend: a deadlock, a connection that never answers. An
// assigned partition without a worker (an orphan, see orphan.go) whose
// records wait uncommitted as long counts as stalled too.
// The engine says so once per stall, in an error line and in
// projector_partition_stalled, and Live fails, so that the process is
// restarted (Kubernetes' liveness probe) and the partition moves.

// newStalledGauge registers projector_partition_stalled with reg.
func newStalledGauge(reg prometheus.Registerer, labels prometheus.Labels) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name:        "projector_partition_stalled",
		ConstLabels: labels,
		Help:        "1 while a partition has had records to apply and committed none for --stall-after; /livez fails meanwhile.",
	}, []string{"topic", "partition"})
	reg.MustRegister(g)
	return g
}

// stallEvery is how often the engine looks for stalled workers: a tenth of
// StallAfter, within bounds.
func stallEvery(after time.Duration) time.Duration {
	return min(max(after/10, 50*time.Millisecond), 10*time.Second)
}

// watchStalls reports workers as they stall and recover, until ctx ends.
func (e *Engine) watchStalls(ctx context.Context) {
	after := e.cfg.Partition.StallAfter
	if after <= 0 {
		after = partition.DefaultStallAfter
	}
	t := time.NewTicker(stallEvery(after))
	defer t.Stop()
	stalled := map[sinks.TP]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := map[sinks.TP]bool{}
		for _, s := range e.Workers() {
			if !s.Stalled {
				continue
			}
			now[s.TP] = true
			if !stalled[s.TP] {
				e.group.stalled.WithLabelValues(s.Topic, strconv.Itoa(int(s.Partition))).Set(1)
				e.log.Error("partition stalled: records wait and nothing has committed; /livez fails so that the member is restarted",
					"topic", s.Topic, "partition", s.Partition, "since", s.ProgressAt.UTC().Format(time.RFC3339), "next_offset", s.NextOffset,
					"backing_off", !s.BackoffSince.IsZero())
			}
		}
		for tp := range stalled {
			if !now[tp] {
				e.group.stalled.WithLabelValues(tp.Topic, strconv.Itoa(int(tp.Partition))).Set(0)
				e.log.Info("partition no longer stalled", "topic", tp.Topic, "partition", tp.Partition)
			}
		}
		stalled = now
		e.recordStates(ctx)
	}
}

// Live reports whether the engine's workers make progress: a check fails
// while a partition is stalled (see partition.Status.Stalled).
func (e *Engine) Live(context.Context) map[string]error {
	var stuck []string
	for _, s := range e.Workers() {
		if s.Stalled {
			stuck = append(stuck, fmt.Sprintf("%s/%d has committed nothing since %s while records wait",
				s.Topic, s.Partition, s.ProgressAt.UTC().Format(time.RFC3339)))
		}
	}
	for _, o := range e.orphanStatus() {
		if o.Stalled {
			stuck = append(stuck, fmt.Sprintf("%s/%d has no worker since %s (%s) and its records wait uncommitted",
				o.Topic, o.Partition, o.Since.UTC().Format(time.RFC3339), o.Reason))
		}
	}
	checks := map[string]error{"partitions": nil}
	if len(stuck) > 0 {
		slices.Sort(stuck)
		checks["partitions"] = errors.New(strings.Join(stuck, "; "))
	}
	return checks
}
