package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// A worker applies its partition's records to every projection its topic
// feeds: each is a lane, the worker's own projection the first. The
// worker owns what belongs to the partition (its claim and stored offset,
// fetching, batching, backoff, halts); a lane what belongs to one
// projection of it (its sink, decoder, version gates through the parked
// events it knows, storm guard, metrics). A batch is decoded once per
// reader schema, planned through each lane, and committed with the
// partition's offset in one transaction (CommitBatch for one lane,
// sinks.LaneCommitter's CommitLanes for several), so that every
// projection's table stays at the offset the partition's one row says.

// Lane is another projection a worker's topic feeds (see
// WorkerDeps.Others): its sink and the decoder of its reader schema.
type Lane struct {
	Projection *projection.Projection
	Sink       sinks.Sink
	Decoder    Decoder
}

// LaneStatus is what Status tells of one of the other projections: its
// parked events, and what its committed transactions did (as
// Status.Applied, Stale and DeadLettered).
type LaneStatus struct {
	Projection                   string
	Parked                       int
	OldestParked                 time.Time
	Applied, Stale, DeadLettered int64
}

// lane is one projection of a worker's partition: what planning a batch
// for it needs, and what it keeps between batches. Only Run's goroutine
// touches it, but for gaps and totals, which Status reads.
type lane struct {
	w      *Worker // the worker whose partition it is
	i      int     // its index in w.lanes
	proj   *projection.Projection
	sink   sinks.Sink
	peeker sinks.Peeker // sink, when it reads state outside a batch (nil: it does not)
	dec    Decoder
	values ValuesDecoder // dec, when events are decoded into values (see ValuesDecoder)
	// decodedBy is the index of the earlier lane whose decoded records
	// this one shares, its decoder being the same (-1: it decodes them
	// itself).
	decodedBy int
	log       *slog.Logger
	// batchMem is the memory of the batches a window plans, one after
	// the other (see batchMemory).
	batchMem batchMemory
	// keyIndex is the index of a batch's keys that batchKeys builds,
	// cleared and used again by the next batch.
	keyIndex map[string]int
	// guard keeps the outcomes of the partition's recent records in this
	// projection (see storm.go); deadLog what it has to say of its dead
	// letters (see logDeadLetters).
	guard   stormGuard
	deadLog map[string]*classLog
	gaps    gaps
	// totals count what committed transactions did (see Status).
	totals struct{ applied, stale, dead atomic.Int64 }
}

// newLane adds a lane for projection p, committed through sink and
// decoded by dec, to the worker.
func (w *Worker) newLane(p *projection.Projection, sink sinks.Sink, dec Decoder, log *slog.Logger) {
	l := &lane{w: w, i: len(w.lanes), proj: p, sink: sink, dec: dec, log: log, decodedBy: -1, guard: newStormGuard(w.cfg)}
	l.peeker, _ = sink.(sinks.Peeker)
	if vd, ok := dec.(ValuesDecoder); ok && vd.Width() > 0 && !p.ReadsFieldsMap() {
		l.values = vd
	}
	for _, e := range w.lanes {
		if sameDecoder(e.dec, l.dec) && (e.values != nil) == (l.values != nil) {
			l.decodedBy = e.i
			break
		}
	}
	w.lanes = append(w.lanes, l)
}

// sameDecoder reports whether a and b are one decoder (projections whose
// reader schemas are the same are given one).
func sameDecoder(a, b Decoder) bool {
	ta := reflect.TypeOf(a)
	return ta != nil && ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// lanesCommit checks that the worker can commit its lanes together.
func (w *Worker) lanesCommit() error {
	if len(w.lanes) == 1 {
		return nil
	}
	if _, ok := w.lanes[0].sink.(sinks.LaneCommitter); !ok {
		return fmt.Errorf("topic %s feeds %d projections, and the sink of projection %q cannot commit them in one transaction (it is no sinks.LaneCommitter)",
			w.claim.Topic, len(w.lanes), w.lanes[0].proj.Name)
	}
	return nil
}

// laneBatch is one lane's part of a batch.
type laneBatch struct {
	l        *lane
	items    []*item
	keys     sinks.Keys
	changes  sinks.Changes
	out      outcomes
	rejected map[string]rejection
	mark     int64 // the lane's storm guard before the batch
}

// process applies recs, a batch taken while the worker is not behind, to
// every lane in a transaction of its own with the partition's offset: the
// records are decoded once per reader schema, each lane's aggregates
// listed, and then planned through each lane's gates and committed
// together.
//
// A batch that would make a dead-letter storm in any lane halts the
// partition (see storm.go) and is tried again, decoded afresh, every
// RetryCap until it commits.
func (w *Worker) process(ctx context.Context, recs []*kgo.Record) (err error) {
	ctx, span := w.startSpan(ctx, recs)
	defer endSpan(span, &err)
	for attempt := 0; ; attempt++ {
		err := w.processOnce(ctx, recs)
		if errors.Is(err, sinks.ErrRefusedData) && w.refusal == nil {
			return w.isolate(ctx, recs, err)
		}
		var trip *stormTrip
		if !errors.As(err, &trip) {
			return err
		}
		w.stormed(trip)
		if err := w.backoff(ctx, attempt, "commit batch", trip); err != nil {
			return err
		}
	}
}

// processOnce is one attempt of process.
func (w *Worker) processOnce(ctx context.Context, recs []*kgo.Record) error {
	start := w.claim.NextOffset
	bs := make([]laneBatch, len(w.lanes))
	var end int64
	for i, l := range w.lanes {
		var (
			items []*item
			err   error
		)
		switch {
		case l.decodedBy >= 0:
			items = l.shareDecoded(bs[l.decodedBy].items)
		case i == 0:
			if items, end, err = l.items(ctx, recs, start, nil); err != nil || end <= start {
				return err
			}
		default:
			if items, _, err = l.items(ctx, recs, start, nil); err != nil {
				return err
			}
		}
		bs[i] = laneBatch{l: l, items: items, keys: batchKeys(items, l.gaps.has, l.keys()), rejected: map[string]rejection{}}
	}
	return w.commitBatch(ctx, len(recs), bs, end)
}

// shareDecoded returns the items another lane decoded with this lane's
// decoder, as this lane's: each one's key, version and type are read
// again with this projection's fields, and a record that could not be
// decoded fails here too.
func (l *lane) shareDecoded(from []*item) []*item {
	out := make([]*item, len(from))
	slab := make([]item, len(from))
	for i, src := range from {
		it := &slab[i]
		*it = item{
			offset: src.offset, recordKey: src.recordKey, value: src.value, headers: src.headers, timestamp: src.timestamp,
			replayOf: src.replayOf, tombstone: src.tombstone, fields: src.fields, names: src.names, values: src.values, schemaID: src.schemaID,
		}
		switch {
		case src.err != nil && (src.class == sinks.ClassDecode || src.class == sinks.ClassOversized ||
			src.class == sinks.ClassInvalidKey || src.class == sinks.ClassRefused):
			it.err, it.class, it.attempts = src.err, src.class, src.attempts
		case it.tombstone:
			keyTombstone(it)
		default:
			l.extract(it)
		}
		out[i] = it
	}
	return out
}

// commitBatch plans each lane's items of a batch of n records inside one
// transaction and commits them with the offset end. A transient failure
// tries again after a backoff; rows Postgres refuses dead-letter their
// aggregates' events, in their projection only, on the next attempt, and
// a fold that keeps failing dead-letters its event after MaxAttempts. A
// plan that would make a dead-letter storm is not committed: commitBatch
// returns its *stormTrip.
func (w *Worker) commitBatch(ctx context.Context, n int, bs []laneBatch, end int64) (err error) {
	giveUp := false // dead-letter events whose fold keeps failing
	sl := make([]sinks.Lane, len(bs))
	for i := range bs {
		b := &bs[i]
		b.mark = b.l.guard.pos()
		sl[i] = sinks.Lane{Sink: b.l.sink, Keys: b.keys, Plan: func(st sinks.State) (sinks.Changes, error) {
			var err error
			b.changes, b.out, err = b.l.plan(ctx, b.items, b.keys.All, st, nil, b.rejected, giveUp)
			if err != nil {
				return b.changes, err
			}
			// Each projection's storm guard judges its own dead letters:
			// one projection's mistake halts the partition, whose offset
			// all of them share.
			b.l.guard.truncate(b.mark) // planned again: an earlier plan's outcomes go
			if trip := b.l.guard.add(b.items, b.changes.DeadLetters); trip != nil {
				trip.projection = b.l.proj.Name
				return sinks.Changes{}, trip
			}
			return b.changes, nil
		}}
	}
	defer func() {
		if err != nil {
			for i := range bs {
				bs[i].l.guard.truncate(bs[i].mark) // the batch did not commit
			}
		}
	}()
	err = w.retryCommit(ctx, n, &giveUp, func() error { return w.commitAs(ctx, w.claim, end, sl) },
		func(rej *sinks.RejectedRows) bool {
			if rej.Lane < 0 || rej.Lane >= len(bs) {
				return false
			}
			b := &bs[rej.Lane]
			rejections(b.rejected, rej)
			w.log.Warn("postgres refused rows; dead-lettering their events", "projection", b.l.proj.Name, "aggregates", len(rej.Keys))
			return true
		})
	if err != nil {
		return err
	}
	w.done()
	w.committed(end, len(bs), func(i int) (*lane, *sinks.Changes, *outcomes, int64) {
		b := &bs[i]
		return b.l, &b.changes, &b.out, b.l.guard.pos()
	})
	return nil
}

// commitAs runs the transaction of lanes, one per lane of the worker in
// their order, under claim (which a transaction committing while the
// worker plans the next one is given as it was when it began), as a
// child span when tracing. One lane commits through its sink's
// CommitBatch, which any sink has.
func (w *Worker) commitAs(ctx context.Context, claim sinks.Claim, end int64, lanes []sinks.Lane) error {
	hwm := w.hwm.Load()
	claim.CaughtUp = hwm >= 0 && end >= hwm
	if w.cfg.Tracer == nil {
		return commitLanes(ctx, claim, end, lanes)
	}
	attrs := []attribute.KeyValue{attribute.String("db.system.name", "postgresql"), attribute.String("db.operation.name", "COMMIT")}
	if len(lanes) > 1 {
		// How many projections share the transaction, where a topic
		// feeds several; a span of one projection's is as it always was.
		attrs = append(attrs, attribute.Int("projector.projections", len(lanes)))
	}
	ctx, span := w.cfg.Tracer.Start(ctx, "commit batch", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	err := commitLanes(ctx, claim, end, lanes)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// commitLanes commits lanes in one transaction: through the first lane's
// sink, a sinks.LaneCommitter when there are several (see lanesCommit).
func commitLanes(ctx context.Context, claim sinks.Claim, end int64, lanes []sinks.Lane) error {
	if len(lanes) == 1 {
		return lanes[0].Sink.CommitBatch(ctx, claim, end, lanes[0].Keys, lanes[0].Plan)
	}
	return lanes[0].Sink.(sinks.LaneCommitter).CommitLanes(ctx, claim, end, lanes)
}
