package partition

import (
	"context"
	"fmt"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/versioning"
)

// batchKeys lists the aggregates of a batch's decoded items (see Keys) and
// gives each item its key's index in Keys.All; parked reports those with
// parked events. It indexes the keys in index, cleared first (nil: a new
// map).
func batchKeys(items []*item, parked func(string) bool, index map[string]int) sinks.Keys {
	var keys sinks.Keys
	keys.All = make([]string, 0, len(items))
	const notNew = -1
	if index == nil {
		index = make(map[string]int, len(items))
	}
	clear(index)
	var low []int64 // per aggregate: its lowest version, or notNew
	for _, it := range items {
		if it.err != nil {
			continue
		}
		i, seen := index[it.key]
		if !seen {
			i = len(keys.All)
			index[it.key] = i
			keys.All = append(keys.All, it.key)
			first := it.version
			if parked(it.key) {
				keys.Parked = append(keys.Parked, it.key)
				first = notNew
			}
			low = append(low, first)
		}
		it.agg = i
		switch {
		case low[i] == notNew:
		case it.tombstone:
			low[i] = notNew
		default:
			low[i] = min(low[i], it.version)
		}
	}
	for i, k := range keys.All {
		if low[i] == 1 {
			keys.New = append(keys.New, k)
		}
	}
	return keys
}

// keys returns the worker's index of a batch's keys (see batchKeys).
func (w *Worker) keys() map[string]int {
	if w.keyIndex == nil {
		w.keyIndex = map[string]int{}
	}
	return w.keyIndex
}

// aggState is one aggregate during planning.
type aggState struct {
	gate    versioning.Aggregate[*item]
	row     projection.Row
	seen    bool // gate and row hold the aggregate's state
	dirty   bool
	deleted bool
}

// plan folds the batch into changes. keys are the batch's aggregates,
// which its items index (see batchKeys). A window's batch passes known,
// the window's aggregates at the index of keys, in place of st.Rows and
// st.Versions: the plan finds each by index rather than by hashing its key
// twice more. It only reads worker state, so it
// may run again when the transaction is retried. Events of rejected
// aggregates are dead-lettered; with giveUp, so are events whose fold keeps
// failing.
func (w *Worker) plan(ctx context.Context, items []*item, keys []string, st sinks.State, known []*windowAgg, rejected map[string]string, giveUp bool) (sinks.Changes, outcomes, error) {
	var (
		ch  sinks.Changes
		out = outcomes{deadLettered: map[string]int{}}
		// Each aggregate's state at its index in keys: items find theirs
		// without hashing their key again.
		aggs = make([]aggState, len(keys))
	)
	get := func(i int) *aggState {
		a := &aggs[i]
		switch {
		case a.seen:
		case known != nil:
			a.row, a.gate.Version, a.seen = known[i].row, known[i].version, true
		default:
			a.row, a.gate.Version, a.seen = st.Rows[keys[i]], st.Versions[keys[i]], true
		}
		return a
	}
	var index map[string]int // of keys, for parked events
	if len(st.Parked) > 0 {
		index = make(map[string]int, len(keys))
		for i, k := range keys {
			index[k] = i
		}
	}
	deadLetter := func(it *item) {
		out.deadLettered[it.class]++
		ch.DeadLetters = append(ch.DeadLetters, sinks.DeadLetter{
			Offset: it.offset, RecordKey: it.recordKey, Value: it.value, Headers: it.headers,
			Timestamp: it.timestamp, Err: it.err.Error(), Class: it.class, Attempts: max(1, it.attempts),
			SchemaID: it.schemaID, TraceID: traceID(it.headers), ReplayOf: it.replayOf,
		})
		if it.restored {
			ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: it.key, Version: it.version})
		}
	}
	resolve := func(it *item) {
		if it.replayOf > 0 {
			ch.Resolved = append(ch.Resolved, it.replayOf)
		}
	}
	for _, ev := range st.Parked {
		if _, bad := rejected[ev.Key]; bad {
			continue // stays parked; the aggregate's row cannot be written now
		}
		it := &item{
			offset: ev.Offset, recordKey: ev.RecordKey, value: ev.Value, headers: ev.Headers,
			timestamp: ev.Timestamp, restored: true,
		}
		if err := w.decode(ctx, it); err != nil {
			if w.cfg.ClassifyDecode(err) != Terminal {
				return ch, out, err // the registry is down: retry the batch
			}
			it.fail(sinks.ClassDecode, fmt.Errorf("decode parked event: %w", err))
		}
		it.key, it.version = ev.Key, ev.Version
		i, ok := index[ev.Key]
		if !ok {
			return ch, out, fmt.Errorf("parked event of %q v%d: not an aggregate of the batch", ev.Key, ev.Version)
		}
		a := get(i)
		switch {
		case it.err != nil:
			deadLetter(it)
		case ev.Version <= a.gate.Version:
			ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: ev.Key, Version: ev.Version}) // superseded
		default:
			a.gate.Restore(ev.Version, it)
		}
	}

	var (
		cur    *aggState
		failed *item
	)
	apply := func(v int64, it *item) error {
		// cur.row is the plan's (see State.Rows) or an earlier fold's.
		row, err := w.proj.FoldOwned(cur.row, it.event(v))
		if err != nil {
			failed = it
			return err
		}
		cur.row, cur.dirty, cur.deleted = row, true, row == nil
		if it.restored {
			ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: it.key, Version: v})
		}
		resolve(it)
		return nil
	}
	for _, it := range items {
		if it.err != nil {
			deadLetter(it)
			continue
		}
		if msg, bad := rejected[it.key]; bad {
			c := *it
			c.fail(sinks.ClassRejected, fmt.Errorf("postgres refused the row of %q: %s", it.key, msg))
			deadLetter(&c)
			continue
		}
		cur = get(it.agg)
		if it.tombstone {
			if cur.row != nil {
				cur.row, cur.dirty, cur.deleted = nil, true, true
			}
			out.applied++
			resolve(it)
			continue
		}
		if w.proj.OnGap == projection.GapApply && versioning.Decide(cur.gate.Version, it.version) == versioning.Parked {
			drop := func(v int64, e *item) {
				if e.restored {
					ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: e.key, Version: v})
				}
			}
			if err := cur.gate.Jump(it.version-1, drop, apply); err != nil {
				return ch, out, err
			}
		}
		failed = nil
		outcome, err := cur.gate.Offer(it.version, it, apply)
		if err != nil {
			if !projection.IsTerminal(err) && !giveUp {
				return ch, out, &foldRetry{fmt.Errorf("fold %q v%d at offset %d: %w", failed.key, failed.version, failed.offset, err)}
			}
			// The failing event is the offered one or a parked successor
			// it unblocked; it leaves the gate and goes to the DLQ.
			f := *failed
			f.fail(sinks.ClassFold, fmt.Errorf("fold %q v%d: %w", failed.key, failed.version, err))
			deadLetter(&f)
			if failed == it {
				continue
			}
		}
		switch outcome {
		case versioning.Applied:
			out.applied++
		case versioning.Stale:
			out.stale++
			resolve(it) // a replay of an event already applied
		case versioning.Parked:
			out.parked++
		}
	}

	ch.Upserts = make([]sinks.RowWrite, 0, len(aggs)) // at most one per aggregate
	for i := range aggs {
		a, key := &aggs[i], keys[i]
		if !a.seen {
			continue
		}
		if a.dirty {
			if a.deleted {
				ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: key, Version: a.gate.Version})
			} else {
				ch.Upserts = append(ch.Upserts, sinks.RowWrite{Key: key, Version: a.gate.Version, Row: a.row})
			}
		}
		a.gate.EachParked(func(v int64, it *item) {
			if !it.restored {
				ch.Park = append(ch.Park, sinks.StoredEvent{
					Key: key, Version: v, Offset: it.offset, RecordKey: it.recordKey, Value: it.value,
					Headers: it.headers, Timestamp: it.timestamp,
				})
			}
		})
	}
	return ch, out, nil
}

// outcomes counts what a batch did, for metrics after commit.
type outcomes struct {
	applied, stale, parked int
	deadLettered           map[string]int // by class
}

// add counts o's outcomes into out.
func (out *outcomes) add(o outcomes) {
	out.applied += o.applied
	out.stale += o.stale
	out.parked += o.parked
	for class, n := range o.deadLettered {
		if out.deadLettered == nil {
			out.deadLettered = map[string]int{}
		}
		out.deadLettered[class] += n
	}
}

// foldRetry is a fold error that may succeed on a later attempt.
type foldRetry struct{ err error }

func (f *foldRetry) Error() string { return f.err.Error() }

func (f *foldRetry) Unwrap() error { return f.err }
