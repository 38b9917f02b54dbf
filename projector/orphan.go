package projector

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// A partition the group assigns to this member can be left without a
// worker: a newer owner claimed it in the offset store (a second member
// of the same identity in another group, a projector dev pointed at the
// same database, a stale assignment), and the worker stopped at its next
// commit. The group's assignment stays with this member, so no other
// member of the group will take the partition; if the newer owner goes
// away, nobody applies its records.
//
// Such a partition is an orphan. The member says so once, then looks at
// it every orphanEvery: it reads the stored owner epoch and offset and the
// log end. While the newer owner moves the stored offset, or has nothing
// to apply, the member leaves it alone. Once the partition has had records
// to apply and its stored position has not moved for ReclaimAfter, the
// newer owner is taken to be gone and the member claims the partition
// back, as it would on assignment: the claim bumps the owner epoch, so
// should the other owner still be alive, at most one of them commits (the
// fenced offset update), and it is the newer claim. An orphan whose
// records have waited for StallAfter counts as stalled (the stall gauge
// and /livez), as a worker that commits nothing does.

// DefaultReclaimAfter is how long an orphaned partition's records wait
// with its stored offset unmoved before the member claims it back.
const DefaultReclaimAfter = 30 * time.Second

// orphan is an assigned partition without a worker (under Engine.mu).
type orphan struct {
	since time.Time // when it lost its worker
	why   string
	// The stored position last seen, and when it last moved or the
	// partition last had nothing to apply: its newer owner's progress.
	epoch   int64
	next    int64
	seen    bool
	movedAt time.Time
	stalled bool // said as stalled (gauge set)
}

// orphanEvery is how often the member looks at its orphans: a quarter of
// ReclaimAfter, within bounds.
func orphanEvery(after time.Duration) time.Duration {
	return min(max(after/4, 50*time.Millisecond), 10*time.Second)
}

// orphaned records that the partition tp, assigned here, has no worker
// because a newer owner than epoch claimed it, and says so once.
func (e *Engine) orphaned(tp sinks.TP, epoch int64, why string) {
	now := e.now()
	e.mu.Lock()
	if e.closing || e.workers[tp] != nil || e.orphans[tp] != nil {
		e.mu.Unlock()
		return
	}
	e.orphans[tp] = &orphan{since: now, why: why, epoch: epoch, movedAt: now}
	e.mu.Unlock()
	e.log.Warn("partition orphaned: the group assigns it to this member, but "+why+"; "+
		"the member claims it back once its records wait and its stored offset has not moved for the reclaim time",
		"topic", tp.Topic, "partition", tp.Partition, "reclaim_after", e.cfg.ReclaimAfter)
}

// unorphan forgets an orphan (call with mu held): it was claimed back or
// is no longer assigned here.
func (e *Engine) unorphan(tp sinks.TP) {
	o := e.orphans[tp]
	if o == nil {
		return
	}
	delete(e.orphans, tp)
	if o.stalled {
		e.group.stalled.WithLabelValues(tp.Topic, strconv.Itoa(int(tp.Partition))).Set(0)
	}
}

// watchOrphans has the poll loop look at the orphans every orphanEvery,
// until ctx ends.
func (e *Engine) watchOrphans(ctx context.Context) {
	t := time.NewTicker(orphanEvery(e.cfg.ReclaimAfter))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		due := len(e.orphans) > 0
		e.orphansDue = due
		e.mu.Unlock()
		if stop := e.stopPoll.Load(); due && stop != nil {
			(*stop)()
		}
	}
}

// recheckOrphans looks at the orphans when they are due, and claims back
// those whose newer owner is gone. It runs in the poll loop, between
// rebalances, so that the partitions are still assigned here.
func (e *Engine) recheckOrphans(ctx context.Context) {
	e.mu.Lock()
	if !e.orphansDue || len(e.orphans) == 0 {
		e.mu.Unlock()
		return
	}
	e.orphansDue = false
	tps := make([]sinks.TP, 0, len(e.orphans))
	for tp := range e.orphans {
		tps = append(tps, tp)
	}
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stored, ends, err := e.orphanPositions(ctx, tps)
	if err != nil {
		e.log.Debug("looking at orphaned partitions failed; looking again", "err", err)
		return
	}
	now := e.now()
	stallAfter := e.cfg.Partition.StallAfter
	if stallAfter <= 0 {
		stallAfter = partition.DefaultStallAfter
	}
	var reclaim []sinks.TP
	e.mu.Lock()
	for _, tp := range tps {
		o := e.orphans[tp]
		if o == nil {
			continue
		}
		c, ok := stored[tp]
		end, known := ends[tp]
		var next int64 = -1
		if ok && c.NextOffset != nil {
			next = *c.NextOffset
		}
		switch {
		case !o.seen || c.Epoch != o.epoch || next != o.next:
			o.movedAt = now // the newer owner moved it
		case known && next >= 0 && next >= end:
			o.movedAt = now // nothing to apply: idle, not gone
		}
		o.seen, o.epoch, o.next = true, c.Epoch, next
		waited := now.Sub(o.movedAt)
		if waited >= stallAfter && !o.stalled {
			o.stalled = true
			e.group.stalled.WithLabelValues(tp.Topic, strconv.Itoa(int(tp.Partition))).Set(1)
			e.log.Error("partition stalled: orphaned, its records wait and nothing has committed; /livez fails so that the member is restarted",
				"topic", tp.Topic, "partition", tp.Partition, "orphaned_since", o.since.UTC().Format(time.RFC3339), "stored_offset", next)
		}
		if waited >= e.cfg.ReclaimAfter {
			reclaim = append(reclaim, tp)
		}
	}
	e.mu.Unlock()
	if len(reclaim) > 0 {
		e.reclaim(ctx, reclaim)
	}
}

// orphanPositions reads the stored positions and the log ends of
// partitions.
func (e *Engine) orphanPositions(ctx context.Context, tps []sinks.TP) (map[sinks.TP]sinks.Claimed, map[sinks.TP]int64, error) {
	claims, err := e.gen.offsets.Owners(ctx, tps)
	if err != nil {
		return nil, nil, err
	}
	stored := make(map[sinks.TP]sinks.Claimed, len(claims))
	for _, c := range claims {
		stored[c.TP] = c
	}
	topics := map[string]bool{}
	var names []string
	for _, tp := range tps {
		if !topics[tp.Topic] {
			topics[tp.Topic] = true
			names = append(names, tp.Topic)
		}
	}
	res, err := e.adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, nil, fmt.Errorf("list log ends of %d orphaned partitions: %w", len(tps), err)
	}
	ends := make(map[sinks.TP]int64, len(tps))
	for _, tp := range tps {
		if o, ok := res.Lookup(tp.Topic, tp.Partition); ok && o.Err == nil {
			ends[tp] = o.Offset
		}
	}
	return stored, ends, nil
}

// reclaim claims orphans back and starts their workers, as on assignment.
func (e *Engine) reclaim(ctx context.Context, tps []sinks.TP) {
	claims, err := e.gen.offsets.Claim(ctx, tps)
	if err != nil {
		e.log.Warn("claiming back orphaned partitions failed; trying again", "partitions", len(tps), "err", err)
		return
	}
	starts, err := e.startOffsets(ctx, claims)
	if err != nil {
		e.log.Warn("claiming back orphaned partitions failed; trying again", "partitions", len(tps), "err", err)
		return
	}
	for _, c := range claims {
		next, ok := starts[c.TP]
		if !ok {
			continue // claimed by a newer owner meanwhile: still an orphan
		}
		e.mu.Lock()
		o := e.orphans[c.TP]
		e.mu.Unlock()
		if o == nil {
			continue // revoked meanwhile
		}
		e.start(sinks.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: next, Since: c.At})
		e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{c.Topic: {c.Partition: {Epoch: -1, Offset: next}}})
		e.cl.ResumeFetchPartitions(map[string][]int32{c.Topic: {c.Partition}})
		e.log.Warn("orphaned partition claimed back: its newer owner applied nothing while records waited",
			"topic", c.Topic, "partition", c.Partition, "next_offset", next, "orphaned_for", e.now().Sub(o.since).Round(time.Second))
	}
}

// orphanStatus lists the orphans, for Live, Ready and status.
func (e *Engine) orphanStatus() []OrphanStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]OrphanStatus, 0, len(e.orphans))
	for tp, o := range e.orphans {
		out = append(out, OrphanStatus{TP: tp, Since: o.since, Reason: o.why, Stalled: o.stalled})
	}
	return out
}

// OrphanStatus is an assigned partition without a worker.
type OrphanStatus struct {
	sinks.TP
	Since   time.Time
	Reason  string
	Stalled bool // its records have waited, uncommitted, for StallAfter
}

// Orphans returns the partitions the group assigns to this member that
// have no worker because a newer owner claimed them.
func (e *Engine) Orphans() []OrphanStatus { return e.orphanStatus() }
