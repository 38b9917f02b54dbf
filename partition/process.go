package partition

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/versioning"
)

// item is one record of a batch, decoded, or one restored parked event.
type item struct {
	offset    int64
	recordKey []byte
	value     []byte
	headers   []sinks.Header
	timestamp time.Time
	replayOf  int64 // dead letter this record replays, 0: none

	key     string
	agg     int // the key's index in the batch's Keys.All (see batchKeys)
	version int64
	typ     string
	fields  map[string]any
	// The record decoded into values (see ValuesDecoder), names nil
	// otherwise.
	names     []string
	values    []any
	schemaID  int
	tombstone bool
	restored  bool // parked in an earlier batch

	// A failed item is dead-lettered.
	err      error
	class    string
	attempts int
}

// batchMemory is where a batch's items and their decoded values are
// made: one allocation each for the batch. A worker that is behind plans
// batch after batch and keeps none of their items once planned (what it
// keeps is copied out: rows, parked events, dead letters), so it makes
// them in the same memory every time (see Worker.planBatch).
type batchMemory struct {
	ptrs   []*item
	items  []item
	values []any
}

// take returns room for n items with width values each, reusing what m
// holds. The items are zeroed by recordItem; values are written by
// decoding before they are read.
func (m *batchMemory) take(n, width int) (ptrs []*item, items []item, values []any) {
	if cap(m.items) < n {
		m.ptrs, m.items = make([]*item, 0, n), make([]item, n)
	}
	if cap(m.values) < n*width {
		m.values = make([]any, n*width)
	}
	return m.ptrs[:0], m.items[:n], m.values[:n*width]
}

func (it *item) fail(class string, err error) {
	it.class, it.err = class, err
}

// event is the item's event at version v.
func (it *item) event(v int64) projection.Event {
	if it.names != nil {
		return projection.NewEvent(it.key, v, it.typ, it.names, it.values)
	}
	return projection.Event{Key: it.key, Version: v, Type: it.typ, Fields: it.fields}
}

// decoded reports whether the item's record has been decoded.
func (it *item) decoded() bool { return it.fields != nil || it.names != nil }

// outcomes counts what a batch did, for metrics after commit.
type outcomes struct {
	applied, stale, parked int
	deadLettered           map[string]int // by class
}

// foldRetry is a fold error that may succeed on a later attempt.
type foldRetry struct{ err error }

func (f *foldRetry) Error() string { return f.err.Error() }
func (f *foldRetry) Unwrap() error { return f.err }

func (w *Worker) process(ctx context.Context, recs []*kgo.Record) (err error) {
	start := w.claim.NextOffset
	ctx, span := w.startSpan(ctx, recs)
	defer endSpan(span, &err)
	items, end, err := w.items(ctx, recs, start, nil)
	if err != nil || end <= start {
		return err
	}

	keys := batchKeys(items, w.gaps.has, w.keys())

	var (
		out      outcomes
		changes  sinks.Changes
		rejected = map[string]string{}
		giveUp   bool // dead-letter events whose fold keeps failing
		folds    int
	)
	plan := func(st sinks.State) (sinks.Changes, error) {
		var err error
		changes, out, err = w.plan(ctx, items, keys.All, st, nil, rejected, giveUp)
		return changes, err
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := w.commitTraced(ctx, end, keys, plan)
		if err == nil {
			w.metrics.commitDuration.Observe(time.Since(began).Seconds())
			w.metrics.batchRecords.Observe(float64(len(recs)))
			w.metrics.commitBatches.Observe(1)
			break
		}
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil {
			return err
		}
		var rej *sinks.RejectedRows
		if errors.As(err, &rej) {
			for k, msg := range rej.Keys {
				rejected[k] = msg
			}
			w.log.Warn("postgres refused rows; dead-lettering their events", "aggregates", len(rej.Keys))
			continue
		}
		var fr *foldRetry
		if errors.As(err, &fr) {
			folds++
			giveUp = folds+1 >= w.cfg.MaxAttempts
		}
		if err := w.backoffPlanned(ctx, attempt, "commit batch", err); err != nil {
			return err
		}
	}
	w.done()
	w.committed(end, changes, out)
	return nil
}

// committed moves the worker past a committed transaction that ended
// before offset end, with changes and outcomes out.
func (w *Worker) committed(end int64, changes sinks.Changes, out outcomes) {
	w.claim.NextOffset = end
	w.next.Store(end)
	w.progress.Store(time.Now().UnixNano())
	if closed := w.gaps.update(changes.Park, changes.Unpark, time.Now()); closed > 0 {
		w.metrics.gaps.WithLabelValues(w.proj.Name, "filled").Add(float64(closed))
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
	dead := 0
	for class, n := range out.deadLettered {
		dead += n
		w.metrics.deadLetters.WithLabelValues(name, class).Add(float64(n))
	}
	m.WithLabelValues(name, topic, "dead_lettered").Add(float64(dead))
	if n := out.deadLettered[sinks.ClassKeyMismatch]; n > 0 {
		w.keyWarn.Do(func() {
			w.log.Warn("dead-lettered records whose record key is not the aggregate their key field names; the producer must key each record by its aggregate id",
				"class", sinks.ClassKeyMismatch, "records", n, "key_field", w.proj.KeyField)
		})
	}
}

// items returns the decoded items of the records from offset start on
// (those before it are committed) and the offset after the last record,
// made in mem (nil: in new memory).
func (w *Worker) items(ctx context.Context, recs []*kgo.Record, start int64, mem *batchMemory) ([]*item, int64, error) {
	if mem == nil {
		mem = &batchMemory{}
	}
	width := 0
	if w.values != nil {
		width = w.values.Width()
	}
	items, slab, values := mem.take(len(recs), width)
	for i, r := range recs {
		if r.Offset < start || r.Attrs.IsControl() {
			continue // already committed, or a transaction marker
		}
		recordItem(&slab[i], r)
		if width > 0 {
			slab[i].values = values[i*width : (i+1)*width : (i+1)*width]
		}
		items = append(items, &slab[i])
	}
	end := recs[len(recs)-1].Offset + 1
	if end <= start {
		return nil, end, nil
	}
	for _, it := range items {
		if len(it.value) > w.cfg.MaxRecordBytes {
			it.fail(sinks.ClassOversized, fmt.Errorf("value of %d bytes is over the %d-byte limit", len(it.value), w.cfg.MaxRecordBytes))
		}
	}
	return items, end, w.decodeAll(ctx, items)
}

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

var traceContext = propagation.TraceContext{}

// startSpan starts the batch's consumer span, linked to the producer
// context each record carries in its traceparent header.
func (w *Worker) startSpan(ctx context.Context, recs []*kgo.Record) (context.Context, trace.Span) {
	if w.cfg.Tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span
	}
	return w.cfg.Tracer.Start(ctx, "process "+w.claim.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(producerLinks(recs)...),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", w.claim.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(w.claim.Partition))),
			attribute.String("messaging.consumer.group.name", w.group),
			attribute.Int("messaging.batch.message_count", len(recs)),
		))
}

// endSpan ends a batch's span, recording *err when set.
func endSpan(span trace.Span, err *error) {
	if *err != nil {
		span.RecordError(*err)
		span.SetStatus(codes.Error, (*err).Error())
	}
	span.End()
}

// linkSpan links the batch's span to the producer contexts of recs too.
func (w *Worker) linkSpan(span trace.Span, recs []*kgo.Record) {
	if w.cfg.Tracer == nil {
		return
	}
	for _, l := range producerLinks(recs) {
		span.AddLink(l)
	}
}

// producerLinks links to the producer context each record carries in its
// traceparent header.
func producerLinks(recs []*kgo.Record) []trace.Link {
	links := make([]trace.Link, 0, len(recs))
	for _, r := range recs {
		sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), kotel.NewRecordCarrier(r)))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// commitTraced runs the batch transaction, as a child span when tracing.
func (w *Worker) commitTraced(ctx context.Context, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	return w.commitAs(ctx, w.claim, end, keys, plan)
}

// commitAs is commitTraced under claim, which a transaction committing
// while the worker plans the next one is given as it was when it began.
func (w *Worker) commitAs(ctx context.Context, claim sinks.Claim, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	if w.cfg.Tracer == nil {
		return w.sink.CommitBatch(ctx, claim, end, keys, plan)
	}
	ctx, span := w.cfg.Tracer.Start(ctx, "commit batch", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system.name", "postgresql"), attribute.String("db.operation.name", "COMMIT")))
	defer span.End()
	err := w.sink.CommitBatch(ctx, claim, end, keys, plan)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// recordItem fills it with what r carries.
func recordItem(it *item, r *kgo.Record) {
	*it = item{offset: r.Offset, recordKey: r.Key, value: r.Value, timestamp: r.Timestamp, tombstone: r.Value == nil}
	if len(r.Headers) > 0 {
		it.headers = make([]sinks.Header, len(r.Headers))
		for i, h := range r.Headers {
			it.headers[i] = sinks.Header{Key: h.Key, Value: h.Value}
			if h.Key == sinks.ReplayHeader {
				it.replayOf, _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
	}
}

// traceID returns the trace id of the record's W3C traceparent header.
func traceID(headers []sinks.Header) string {
	carrier := propagation.MapCarrier{}
	for _, h := range headers {
		if h.Key == "traceparent" || h.Key == "tracestate" {
			carrier[h.Key] = string(h.Value)
		}
	}
	if len(carrier) == 0 {
		return ""
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// decodeAll decodes every item that needs it. Terminal failures stay in
// the item; records whose schema may yet appear are retried up to
// MaxAttempts; an unreachable registry is retried without limit.
func (w *Worker) decodeAll(ctx context.Context, items []*item) error {
	for _, it := range items {
		if it.tombstone && it.err == nil {
			keyTombstone(it) // nothing to decode or retry: its key is the record's
		}
	}
	retries := 0
	for attempt := 0; ; attempt++ {
		var again []*item
		var cause error
		for _, it := range items {
			if it.err != nil || it.decoded() || it.tombstone {
				continue
			}
			err := w.decode(ctx, it)
			if err == nil {
				continue
			}
			switch w.cfg.ClassifyDecode(err) {
			case Terminal:
				it.fail(sinks.ClassDecode, fmt.Errorf("decode: %w", err))
			case Retryable:
				it.attempts = retries + 1
				if retries+1 >= w.cfg.MaxAttempts {
					it.fail(sinks.ClassDecode, fmt.Errorf("decode, after %d attempts: %w", retries+1, err))
				} else {
					again = append(again, it)
					cause = err
				}
			default:
				again = append(again, it)
				cause = err
			}
		}
		if len(again) == 0 {
			if attempt > 0 {
				w.done()
			}
			return nil
		}
		if w.cfg.ClassifyDecode(cause) == Retryable {
			retries++
		}
		if err := w.backoff(ctx, attempt, fmt.Sprintf("decode %d records", len(again)), cause); err != nil {
			return err
		}
	}
}

// decode fills the item's aggregate key, version and fields. A decode
// error is returned for the caller to classify; a decoded record without a
// usable key or version fails the item.
func (w *Worker) decode(ctx context.Context, it *item) error {
	if it.tombstone {
		keyTombstone(it)
		return nil
	}
	var (
		id  int
		err error
	)
	if w.values != nil {
		if it.values == nil { // not of a batch (a parked event)
			it.values = make([]any, w.values.Width())
		}
		it.names, it.fields, id, err = w.values.DecodeValues(ctx, it.value, it.values)
	} else {
		it.fields, id, err = w.dec.Decode(ctx, it.value)
	}
	it.schemaID = id
	if err != nil {
		return err
	}
	p := w.proj
	ev := it.event(0)
	field := func(name string) any {
		v, _ := ev.Field(name)
		return v
	}
	switch k := field(p.KeyField).(type) {
	case string:
		it.key = k
	case nil:
		it.fail(sinks.ClassInvalid, fmt.Errorf("key field %q is missing or null", p.KeyField))
		return nil
	case []byte:
		it.key = string(k)
	default:
		it.key = fmt.Sprint(k)
	}
	if string(it.recordKey) != it.key {
		it.fail(sinks.ClassKeyMismatch, fmt.Errorf("record key %q is not %q, the aggregate key field %q names: the record's partition does not own that aggregate",
			clip(string(it.recordKey)), clip(it.key), p.KeyField))
		return nil
	}
	switch v := field(p.VersionField).(type) {
	case int64:
		it.version = v
	case int32:
		it.version = int64(v)
	case int:
		it.version = int64(v)
	default:
		it.fail(sinks.ClassInvalid, fmt.Errorf("version field %q: want a long, got %T", p.VersionField, v))
		return nil
	}
	if it.version < 1 {
		it.fail(sinks.ClassInvalid, fmt.Errorf("version field %q: %d is below 1", p.VersionField, it.version))
		return nil
	}
	if p.TypeField != "" {
		t, ok := field(p.TypeField).(string)
		if !ok {
			it.fail(sinks.ClassInvalid, fmt.Errorf("type field %q: want a string, got %T", p.TypeField, field(p.TypeField)))
			return nil
		}
		it.typ = t
	}
	return nil
}

// keyTombstone gives a tombstone its aggregate, the one its record key
// names: it has no value to read a key field from. One without a record
// key names none, and fails.
func keyTombstone(it *item) {
	if len(it.recordKey) == 0 {
		it.fail(sinks.ClassInvalid, errors.New("tombstone without a record key"))
		return
	}
	it.key = string(it.recordKey)
}

// clip shortens s for an error message, at a character's start.
func clip(s string) string {
	const most = 100
	if len(s) <= most {
		return s
	}
	end := most
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "…"
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

// reasonOf labels a transient failure for the retries metric.
func reasonOf(err error) string {
	var (
		ne interface{ Timeout() bool }
		fr *foldRetry
	)
	switch {
	case errors.As(err, &fr):
		return "fold"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return "postgres"
	}
	return "error"
}
