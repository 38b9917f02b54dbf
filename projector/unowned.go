package projector

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/sinks"
)

// A member exports the lag of the partitions it runs. Were that all, a
// partition no live member runs would have no lag series at all, and a
// dashboard summing lag would read a dead fleet as caught up. So one
// member of the group, the one with the lowest member ID among those the
// group's coordinator lists holding a partition, also exports the lag of the identity's
// partitions the group assigns to no member (a member gone with the
// rebalance still pending, partitions added to a topic, a group being
// formed) or to a static member that stopped without leaving (it recorded
// them released, see releaseStates; such a member is no candidate to
// export), and every member exports its own assigned partitions that run
// no worker (orphans, see orphan.go). Only one member exports a given
// partition, so sums over the fleet count it once; the owner's own series
// replaces it when a worker starts. A member killed outright holds its
// assignment until its session times out: until then its partitions count
// as owned.
//
// The values come from the stored next offset in the store and the log
// end from the brokers, read every watchTimes.unowned with requests
// bounded by watchTimes.request, never at scrape time: a scrape reads the
// last values. projector_consumer_lag_seconds of such a partition is the
// age of the record at its stored offset, fetched once per offset.
//
// A halted partition (its stored offset not in the log) has fetched no
// record, so it has no oldest record of its own: its age is that of the
// record at its stored offset, fetched once, or when that record is gone
// (deleted by retention, or past the log end) the time the halt began.

// unownedLag is what the last look found.
type unownedLag struct {
	mu    sync.Mutex
	parts []unownedPartition
	// times are the record timestamps fetched, by partition: the offset
	// asked and the record's time (zero: no record there).
	times map[sinks.TP]recordTime
}

type unownedPartition struct {
	tp        sinks.TP
	next, lag int64 // the stored next offset (or where it would start) and the records behind it
	// oldest is the time of the record at the stored offset; zero when
	// caught up or when it could not be fetched.
	oldest time.Time
}

type recordTime struct {
	offset int64
	at     time.Time
}

// watchLag looks at the unowned and halted partitions every
// watchTimes.unowned until ctx ends.
func (e *Engine) watchLag(ctx context.Context) {
	t := time.NewTicker(e.watch.unowned)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.lookUnowned(ctx)
	}
}

// lookUnowned finds the partitions this member exports the lag of
// without running them, and the record times of those and of the
// halted partitions.
func (e *Engine) lookUnowned(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, e.watch.request)
	defer cancel()
	want := map[sinks.TP]int64{} // partition → offset whose record time is wanted
	for _, s := range e.Workers() {
		if s.Halted != "" && s.Oldest.IsZero() {
			want[s.TP] = s.NextOffset
		}
	}
	parts, known := e.unownedPartitions(ctx)
	if !known {
		// The group is rebalancing: what it assigns is not known, so
		// what was last found stands until it settles.
		parts, _ = e.unownedNow()
	}
	for _, p := range parts {
		if p.lag > 0 {
			want[p.tp] = p.next
		}
	}
	e.unowned.mu.Lock()
	if e.unowned.times == nil {
		e.unowned.times = map[sinks.TP]recordTime{}
	}
	ask := map[string]map[int32]int64{}
	for tp, off := range want {
		if rt, ok := e.unowned.times[tp]; ok && rt.offset == off {
			continue // fetched once per offset
		}
		if ask[tp.Topic] == nil {
			ask[tp.Topic] = map[int32]int64{}
		}
		ask[tp.Topic][tp.Partition] = off
	}
	e.unowned.mu.Unlock()
	var got map[string]map[int32]time.Time
	if len(ask) > 0 {
		got, _ = kafkaclient.RecordTimes(ctx, e.cl, ask) // none on failure: asked again next time
	}
	e.unowned.mu.Lock()
	defer e.unowned.mu.Unlock()
	for t, ps := range ask {
		for p, off := range ps {
			// A record not there (deleted, or past the log end) is
			// remembered as such; a failed fetch is asked again.
			if at, ok := got[t][p]; ok || got != nil {
				e.unowned.times[sinks.TP{Topic: t, Partition: p}] = recordTime{offset: off, at: at}
			}
		}
	}
	// Forget the times of partitions no longer looked at.
	for tp := range e.unowned.times {
		if _, ok := want[tp]; !ok {
			delete(e.unowned.times, tp)
		}
	}
	for i, p := range parts {
		if p.lag > 0 {
			parts[i].oldest = e.unowned.times[p.tp].at
		}
	}
	e.unowned.parts = parts
}

// unownedPartitions returns the partitions this member exports the lag
// of without running them, with their lag. None when the group cannot be
// described or the log ends cannot be listed: better no series than a
// wrong one; known is false while the group rebalances, when what it
// assigns cannot be told.
func (e *Engine) unownedPartitions(ctx context.Context) (parts []unownedPartition, known bool) {
	if !inGroup(e.cl) {
		return nil, true
	}
	me, _ := e.cl.GroupMetadata()
	members, settled, err := kafkaclient.GroupMembers(ctx, e.cl, e.cfg.Identity)
	if err != nil {
		return nil, true
	}
	if !settled {
		return nil, false
	}
	// A static member that stopped has released its partitions (see
	// releaseStates) though the group still assigns them to it: they are
	// exported as unowned, and the member is no candidate to export.
	released := map[sinks.TP]bool{}
	if sr, ok := e.cfg.Store.(StateReader); ok {
		states, err := sr.PartitionStates(ctx, e.cfg.Identity)
		if err != nil {
			return nil, true
		}
		for tp, st := range states {
			if st.State == sinks.PartitionReleased {
				released[tp] = true
			}
		}
	}
	// The member to export is the lowest member ID of those holding a
	// partition they did not release, or when none does (a group being
	// formed) of all: a stopped static member may still be listed with
	// nothing assigned, or with only what it released.
	assigned := kadm.TopicsSet{}
	var holding, all []string
	for _, m := range members {
		all = append(all, m.ID)
		holds := false
		m.Assigned.Each(func(t string, p int32) {
			if !released[sinks.TP{Topic: t, Partition: p}] {
				holds = true
				assigned.Add(t, p)
			}
		})
		if holds {
			holding = append(holding, m.ID)
		}
	}
	if len(holding) == 0 {
		holding = all
	}
	reporter := len(holding) > 0 && slices.Min(holding) == me
	e.mu.Lock()
	candidates := map[sinks.TP]bool{}
	for tp := range e.orphans {
		candidates[tp] = true
	}
	running := map[sinks.TP]bool{}
	for tp := range e.workers {
		running[tp] = true
	}
	e.mu.Unlock()
	if !reporter && len(candidates) == 0 {
		return nil, true // nothing to look at: no request to the brokers
	}
	topics := slices.Sorted(maps.Keys(e.byTopic))
	ends, err := e.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, true
	}
	if reporter {
		ends.Each(func(o kadm.ListedOffset) {
			if o.Err == nil && !assigned.Lookup(o.Topic, o.Partition) {
				candidates[sinks.TP{Topic: o.Topic, Partition: o.Partition}] = true
			}
		})
	}
	for tp := range running {
		delete(candidates, tp)
	}
	if len(candidates) == 0 {
		return nil, true
	}
	tps := slices.SortedFunc(maps.Keys(candidates), func(a, b sinks.TP) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	owners, err := e.gen.offsets.Owners(ctx, tps)
	if err != nil {
		return nil, true
	}
	next := map[sinks.TP]int64{}
	for _, c := range owners {
		if c.NextOffset != nil {
			next[c.TP] = *c.NextOffset
		}
	}
	// A partition never started begins where StartFrom says: at the log
	// start, its whole log is behind; at the log end, nothing is.
	var starts kadm.ListedOffsets
	if e.cfg.StartFrom != StartLatest && slices.ContainsFunc(tps, func(tp sinks.TP) bool { _, ok := next[tp]; return !ok }) {
		if starts, err = e.adm.ListStartOffsets(ctx, topics...); err != nil {
			return nil, true
		}
	}
	for _, tp := range tps {
		end, ok := ends.Lookup(tp.Topic, tp.Partition)
		if !ok || end.Err != nil {
			continue
		}
		n, stored := next[tp]
		if !stored {
			n = end.Offset
			if s, ok := starts.Lookup(tp.Topic, tp.Partition); ok && s.Err == nil {
				n = s.Offset
			}
		}
		if n > end.Offset {
			continue // past the log end: no lag to tell
		}
		parts = append(parts, unownedPartition{tp: tp, next: n, lag: end.Offset - n})
	}
	return parts, true
}

// unownedNow returns the partitions last found unowned, but those that
// run a worker now, and the record times fetched.
func (e *Engine) unownedNow() ([]unownedPartition, map[sinks.TP]recordTime) {
	e.unowned.mu.Lock()
	defer e.unowned.mu.Unlock()
	return slices.Clone(e.unowned.parts), maps.Clone(e.unowned.times)
}
