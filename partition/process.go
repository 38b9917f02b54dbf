package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/versioning"
)

// item is one record of a batch, decoded, or one restored parked event.
type item struct {
	offset    int64
	recordKey []byte
	value     []byte
	headers   []Header
	timestamp time.Time

	key       string
	version   int64
	typ       string
	fields    map[string]any
	tombstone bool
	restored  bool  // parked in an earlier batch
	err       error // terminal: dead-letter it
}

// outcomes counts what a batch did, for metrics after commit.
type outcomes struct {
	applied, stale, parked, deadLettered int
}

func (w *Worker) process(ctx context.Context, recs []*kgo.Record) error {
	start := w.claim.NextOffset
	items := make([]*item, 0, len(recs))
	for _, r := range recs {
		if r.Offset < start || r.Attrs.IsControl() {
			continue // already committed, or a transaction marker
		}
		it, err := w.decode(ctx, recordItem(r))
		if err != nil {
			return err
		}
		items = append(items, it)
	}
	end := recs[len(recs)-1].Offset + 1
	if end <= start {
		return nil
	}

	keys := make([]string, 0, len(items))
	var parked []string
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if it.err != nil || seen[it.key] {
			continue
		}
		seen[it.key] = true
		keys = append(keys, it.key)
		if w.parkedKeys[it.key] {
			parked = append(parked, it.key)
		}
	}

	var (
		out     outcomes
		changes Changes
	)
	plan := func(st State) (Changes, error) {
		var err error
		changes, out, err = w.plan(ctx, items, st)
		return changes, err
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := w.sink.CommitBatch(ctx, w.claim, end, keys, parked, plan)
		if err == nil {
			w.metrics.commitDuration.Observe(time.Since(began).Seconds())
			break
		}
		if errors.Is(err, ErrFenced) || ctx.Err() != nil {
			return err
		}
		if err := w.backoff(ctx, attempt, "commit batch", err); err != nil {
			return err
		}
	}

	w.claim.NextOffset = end
	w.next.Store(end)
	for _, p := range changes.Park {
		w.parkedKeys[p.Key] = true
	}
	w.mu.Lock()
	if len(w.queue) > 0 {
		w.oldest = w.queue[0].Timestamp
	} else {
		w.oldest = time.Time{}
	}
	w.mu.Unlock()
	m := w.metrics.processed
	name, topic := w.proj.Name, w.claim.Topic
	m.WithLabelValues(name, topic, "applied").Add(float64(out.applied))
	m.WithLabelValues(name, topic, "stale").Add(float64(out.stale))
	m.WithLabelValues(name, topic, "parked").Add(float64(out.parked))
	m.WithLabelValues(name, topic, "dead_lettered").Add(float64(out.deadLettered))
	return nil
}

func recordItem(r *kgo.Record) *item {
	it := &item{offset: r.Offset, recordKey: r.Key, value: r.Value, timestamp: r.Timestamp, tombstone: r.Value == nil}
	if len(r.Headers) > 0 {
		it.headers = make([]Header, len(r.Headers))
		for i, h := range r.Headers {
			it.headers[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	return it
}

// decode fills the item's aggregate key, version and fields. A terminal
// failure is kept in it.err (the record is dead-lettered); a transient one
// is returned.
func (w *Worker) decode(ctx context.Context, it *item) (*item, error) {
	if it.tombstone {
		if len(it.recordKey) == 0 {
			it.err = errors.New("tombstone without a record key")
		}
		it.key = string(it.recordKey)
		return it, nil
	}
	for attempt := 0; ; attempt++ {
		fields, _, err := w.dec.Decode(ctx, it.value)
		if err == nil {
			it.fields = fields
			break
		}
		if w.cfg.IsTerminal(err) {
			it.err = fmt.Errorf("decode: %w", err)
			return it, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := w.backoff(ctx, attempt, fmt.Sprintf("decode offset %d", it.offset), err); err != nil {
			return nil, err
		}
	}
	p := w.proj
	switch k := it.fields[p.KeyField].(type) {
	case string:
		it.key = k
	case nil:
		it.err = fmt.Errorf("key field %q is missing or null", p.KeyField)
		return it, nil
	case []byte:
		it.key = string(k)
	default:
		it.key = fmt.Sprint(k)
	}
	switch v := it.fields[p.VersionField].(type) {
	case int64:
		it.version = v
	case int32:
		it.version = int64(v)
	default:
		it.err = fmt.Errorf("version field %q: want a long, got %T", p.VersionField, v)
		return it, nil
	}
	if it.version < 1 {
		it.err = fmt.Errorf("version field %q: %d is below 1", p.VersionField, it.version)
		return it, nil
	}
	if p.TypeField != "" {
		t, ok := it.fields[p.TypeField].(string)
		if !ok {
			it.err = fmt.Errorf("type field %q: want a string, got %T", p.TypeField, it.fields[p.TypeField])
			return it, nil
		}
		it.typ = t
	}
	return it, nil
}

// aggState is one aggregate during planning.
type aggState struct {
	gate    versioning.Aggregate[*item]
	row     projection.Row
	dirty   bool
	deleted bool
}

// plan folds the batch into changes. It only reads worker state, so it may
// run again when the transaction is retried.
func (w *Worker) plan(ctx context.Context, items []*item, st State) (Changes, outcomes, error) {
	var (
		ch   Changes
		out  outcomes
		aggs = make(map[string]*aggState, len(st.Versions)+len(items))
	)
	get := func(key string) *aggState {
		a := aggs[key]
		if a == nil {
			a = &aggState{row: st.Rows[key]}
			a.gate.Version = st.Versions[key]
			aggs[key] = a
		}
		return a
	}
	deadLetter := func(it *item, cause error) {
		out.deadLettered++
		ch.DeadLetters = append(ch.DeadLetters, DeadLetter{
			Offset: it.offset, RecordKey: it.recordKey, Value: it.value, Headers: it.headers,
			Timestamp: it.timestamp, Err: cause.Error(),
		})
		if it.restored {
			ch.Unpark = append(ch.Unpark, ParkedRef{Key: it.key, Version: it.version})
		}
	}
	for _, ev := range st.Parked {
		it := &item{
			offset: ev.Offset, recordKey: ev.RecordKey, value: ev.Value, headers: ev.Headers,
			timestamp: ev.Timestamp, restored: true,
		}
		if _, err := w.decode(ctx, it); err != nil {
			return ch, out, err
		}
		it.key, it.version = ev.Key, ev.Version
		a := get(ev.Key)
		if it.err != nil || ev.Version <= a.gate.Version {
			// Undecodable now, or superseded: it can never apply.
			if it.err != nil {
				deadLetter(it, it.err)
			} else {
				ch.Unpark = append(ch.Unpark, ParkedRef{Key: ev.Key, Version: ev.Version})
			}
			continue
		}
		a.gate.Restore(ev.Version, it)
	}

	var (
		cur    *aggState
		failed *item
	)
	apply := func(v int64, it *item) error {
		row, err := w.proj.Fold(cur.row, projection.Event{Key: it.key, Version: v, Type: it.typ, Fields: it.fields})
		if err != nil {
			failed = it
			return err
		}
		cur.row, cur.dirty, cur.deleted = row, true, row == nil
		if it.restored {
			ch.Unpark = append(ch.Unpark, ParkedRef{Key: it.key, Version: v})
		}
		return nil
	}
	for _, it := range items {
		if it.err != nil {
			deadLetter(it, it.err)
			continue
		}
		cur = get(it.key)
		if it.tombstone {
			if cur.row != nil {
				cur.row, cur.dirty, cur.deleted = nil, true, true
			}
			out.applied++
			continue
		}
		if w.proj.OnGap == projection.GapApply && versioning.Decide(cur.gate.Version, it.version) == versioning.Parked {
			drop := func(v int64, e *item) {
				if e.restored {
					ch.Unpark = append(ch.Unpark, ParkedRef{Key: e.key, Version: v})
				}
			}
			if err := cur.gate.Jump(it.version-1, drop, apply); err != nil {
				return ch, out, err
			}
		}
		failed = nil
		outcome, err := cur.gate.Offer(it.version, it, apply)
		if err != nil {
			if !projection.IsTerminal(err) {
				return ch, out, fmt.Errorf("fold %q v%d at offset %d: %w", failed.key, failed.version, failed.offset, err)
			}
			// The failing event is the offered one or a parked successor
			// it unblocked; it leaves the gate and goes to the DLQ.
			deadLetter(failed, fmt.Errorf("fold %q v%d: %w", failed.key, failed.version, err))
			if failed == it {
				continue
			}
		}
		switch outcome {
		case versioning.Applied:
			out.applied++
		case versioning.Stale:
			out.stale++
		case versioning.Parked:
			out.parked++
		}
	}

	for key, a := range aggs {
		if a.dirty {
			if a.deleted {
				ch.Deletes = append(ch.Deletes, RowDelete{Key: key, Version: a.gate.Version})
			} else {
				ch.Upserts = append(ch.Upserts, RowWrite{Key: key, Version: a.gate.Version, Row: a.row})
			}
		}
		a.gate.EachParked(func(v int64, it *item) {
			if !it.restored {
				ch.Park = append(ch.Park, StoredEvent{
					Key: key, Version: v, Offset: it.offset, RecordKey: it.recordKey, Value: it.value,
					Headers: it.headers, Timestamp: it.timestamp,
				})
			}
		})
	}
	return ch, out, nil
}

// reasonOf labels a transient failure for the retries metric.
func reasonOf(err error) string {
	var ne interface{ Timeout() bool }
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "error"
}
