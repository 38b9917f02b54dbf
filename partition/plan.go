package partition

import (
	"context"
	"fmt"

	"github.com/projector-dev/projector/internal/redact"
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

// keys returns the lane's index of a batch's keys (see batchKeys).
func (l *lane) keys() map[string]int {
	if l.keyIndex == nil {
		l.keyIndex = map[string]int{}
	}
	return l.keyIndex
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
// twice more. It only reads the lane's state, so it
// may run again when the transaction is retried. Events of rejected
// aggregates are dead-lettered; with giveUp, so are events whose fold keeps
// failing.
//
// It runs in three steps: the parked events the sink returned go back
// into their aggregates' gates (restoreParked), each item of the batch
// passes its aggregate's gate (gate), and what the aggregates became is
// collected into the changes (collect).
func (l *lane) plan(ctx context.Context, items []*item, keys []string, st sinks.State, known []*windowAgg, rejected map[string]rejection, giveUp bool) (sinks.Changes, outcomes, error) {
	p := &planner{
		l: l, keys: keys, st: st, known: known, rejected: rejected, giveUp: giveUp,
		out: outcomes{deadLettered: map[string]int{}},
		// Each aggregate's state at its index in keys: items find theirs
		// without hashing their key again.
		aggs: make([]aggState, len(keys)),
	}
	p.applyFn = p.apply // one closure for the batch, not one per item
	if err := p.restoreParked(ctx); err != nil {
		return p.ch, p.out, err
	}
	for _, it := range items {
		if err := p.gate(it); err != nil {
			return p.ch, p.out, err
		}
	}
	p.collect()
	return p.ch, p.out, nil
}

// planner is one run of plan: what it reads and what it has planned.
type planner struct {
	l        *lane
	keys     []string
	st       sinks.State
	known    []*windowAgg
	rejected map[string]rejection
	giveUp   bool

	ch   sinks.Changes
	out  outcomes
	aggs []aggState
	// cur is the aggregate whose gate an item passes; failed the event
	// whose fold failed last (the offered one or a parked successor).
	cur     *aggState
	failed  *item
	applyFn func(int64, *item) error
}

// agg returns the state of the aggregate at index i of keys, read from
// the window's aggregates or the sink's state the first time.
func (p *planner) agg(i int) *aggState {
	a := &p.aggs[i]
	switch {
	case a.seen:
	case p.known != nil:
		a.row, a.gate.Version, a.seen = p.known[i].row, p.known[i].version, true
	default:
		a.row, a.gate.Version, a.seen = p.st.Rows[p.keys[i]], p.st.Versions[p.keys[i]], true
	}
	return a
}

// deadLetter plans the failed item's dead letter; a parked event leaves
// the parked events with it.
func (p *planner) deadLetter(it *item) {
	p.out.deadLettered[it.class]++
	p.ch.DeadLetters = append(p.ch.DeadLetters, sinks.DeadLetter{
		Offset: it.offset, RecordKey: it.recordKey, Value: it.value, Headers: it.headers,
		Timestamp: it.timestamp, Err: it.err.Error(), Class: it.class, Attempts: max(1, it.attempts),
		SchemaID: it.schemaID, TraceID: traceID(it.headers), ReplayOf: it.replayOf,
	})
	if it.restored {
		p.ch.Unpark = append(p.ch.Unpark, sinks.ParkedRef{Key: it.key, Version: it.version})
	}
}

// resolve marks the dead letter the item replays, if any, as resolved.
func (p *planner) resolve(it *item) {
	if it.replayOf > 0 {
		p.ch.Resolved = append(p.ch.Resolved, it.replayOf)
	}
}

// restoreParked decodes the parked events the sink returned and puts
// each back into its aggregate's gate, or unparks it when its aggregate
// has moved past it. An error retries the batch.
func (p *planner) restoreParked(ctx context.Context) error {
	if len(p.st.Parked) == 0 {
		return nil
	}
	index := make(map[string]int, len(p.keys)) // of keys, for parked events
	for i, k := range p.keys {
		index[k] = i
	}
	for _, ev := range p.st.Parked {
		if _, bad := p.rejected[ev.Key]; bad {
			continue // stays parked; the aggregate's row cannot be written now
		}
		it := &item{
			offset: ev.Offset, recordKey: ev.RecordKey, value: ev.Value, headers: ev.Headers,
			timestamp: ev.Timestamp, restored: true,
		}
		if err := p.l.decode(ctx, it); err != nil {
			if p.l.w.cfg.ClassifyDecode(err) != Terminal {
				return err // the registry is down: retry the batch
			}
			it.fail(sinks.ClassDecode, fmt.Errorf("decode parked event: %w", err))
		}
		it.key, it.version = ev.Key, ev.Version
		i, ok := index[ev.Key]
		if !ok {
			return fmt.Errorf("parked event of %q v%d: not an aggregate of the batch", clip(ev.Key), ev.Version)
		}
		a := p.agg(i)
		switch {
		case it.err != nil:
			p.deadLetter(it)
		case ev.Version <= a.gate.Version:
			p.ch.Unpark = append(p.ch.Unpark, sinks.ParkedRef{Key: ev.Key, Version: ev.Version}) // superseded
		default:
			a.gate.Restore(ev.Version, it)
		}
	}
	return nil
}

// apply folds the event of it at version v into the current aggregate's
// row; the gate calls it for each event it lets through.
func (p *planner) apply(v int64, it *item) error {
	// cur.row is the plan's (see State.Rows) or an earlier fold's.
	row, err := p.l.proj.FoldOwned(p.cur.row, it.event(v))
	if err != nil {
		p.failed = it
		return err
	}
	p.cur.row, p.cur.dirty, p.cur.deleted = row, true, row == nil
	if it.restored {
		p.ch.Unpark = append(p.ch.Unpark, sinks.ParkedRef{Key: it.key, Version: v})
	}
	p.resolve(it)
	return nil
}

// drop unparks a parked event the gate skips past (GapApply).
func (p *planner) drop(v int64, e *item) {
	if e.restored {
		p.ch.Unpark = append(p.ch.Unpark, sinks.ParkedRef{Key: e.key, Version: v})
	}
}

// gate passes one item of the batch through its aggregate's version gate:
// it is applied (with the parked successors it unblocks), stale, parked,
// or dead-lettered. An error that may succeed later retries the batch.
func (p *planner) gate(it *item) error {
	if it.err != nil {
		p.deadLetter(it)
		return nil
	}
	if r, bad := p.rejected[it.key]; bad {
		c := *it
		c.fail(r.class, fmt.Errorf("postgres refused the row of %q: %s", clip(it.key), redact.ClipTo(r.msg, 4*redact.MaxQuoted)))
		p.deadLetter(&c)
		return nil
	}
	p.cur = p.agg(it.agg)
	cur := p.cur
	if it.tombstone {
		if cur.row != nil {
			cur.row, cur.dirty, cur.deleted = nil, true, true
		}
		p.out.applied++
		p.resolve(it)
		return nil
	}
	if p.l.proj.OnGap == projection.GapApply && versioning.Decide(cur.gate.Version, it.version) == versioning.Parked {
		if err := cur.gate.Jump(it.version-1, p.drop, p.applyFn); err != nil {
			return err
		}
	}
	p.failed = nil
	outcome, err := cur.gate.Offer(it.version, it, p.applyFn)
	if err != nil {
		failed := p.failed
		if !projection.IsTerminal(err) && !p.giveUp {
			return &foldRetry{fmt.Errorf("fold %q v%d at offset %d: %w", clip(failed.key), failed.version, failed.offset, err)}
		}
		// The failing event is the offered one or a parked successor
		// it unblocked; it leaves the gate and goes to the DLQ.
		f := *failed
		f.fail(sinks.ClassFold, fmt.Errorf("fold %q v%d: %w", clip(failed.key), failed.version, err))
		p.deadLetter(&f)
		if failed == it {
			return nil
		}
	}
	switch outcome {
	case versioning.Applied:
		p.out.applied++
	case versioning.Stale:
		p.out.stale++
		p.resolve(it) // a replay of an event already applied
	case versioning.Parked:
		p.out.parked++
	}
	return nil
}

// collect writes what the batch's aggregates became into the changes: at
// most one row write or delete each, and the events still parked that
// the batch parked.
func (p *planner) collect() {
	p.ch.Upserts = make([]sinks.RowWrite, 0, len(p.aggs)) // at most one per aggregate
	for i := range p.aggs {
		a, key := &p.aggs[i], p.keys[i]
		if !a.seen {
			continue
		}
		if a.dirty {
			if a.deleted {
				p.ch.Deletes = append(p.ch.Deletes, sinks.RowDelete{Key: key, Version: a.gate.Version})
			} else {
				p.ch.Upserts = append(p.ch.Upserts, sinks.RowWrite{Key: key, Version: a.gate.Version, Row: a.row})
			}
		}
		a.gate.EachParked(func(v int64, it *item) {
			if !it.restored {
				p.ch.Park = append(p.ch.Park, sinks.StoredEvent{
					Key: key, Version: v, Offset: it.offset, RecordKey: it.recordKey, Value: it.value,
					Headers: it.headers, Timestamp: it.timestamp,
				})
			}
		})
	}
}

// rejection is why Postgres refused an aggregate's row: its message, and
// the class its events are dead-lettered with.
type rejection struct{ msg, class string }

// rejections adds the rows rej reports to rejected.
func rejections(rejected map[string]rejection, rej *sinks.RejectedRows) {
	for k, msg := range rej.Keys {
		class := sinks.ClassRejected
		if rej.Invalid[k] {
			class = sinks.ClassInvalidValue
		}
		rejected[k] = rejection{msg: msg, class: class}
	}
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
