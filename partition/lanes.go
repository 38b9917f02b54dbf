package partition

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

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

// newLanes makes a lane of its own for each of d.Others. A lane is a
// worker that never runs: its lead fetches, batches and commits, and
// plans each batch through each lane's gate, parked events and sink.
func (w *Worker) newLanes(d WorkerDeps) {
	if len(d.Others) == 0 {
		return
	}
	all := []*Worker{w}
	for _, l := range d.Others {
		o := newWorker(w.cfg, WorkerDeps{
			Group: d.Group, Claim: d.Claim, Projection: l.Projection, Sink: l.Sink, Decoder: l.Decoder,
			Log: d.Log, Metrics: d.Metrics, Now: d.Now,
		})
		o.lead = w
		o.log = w.log.With("projection", l.Projection.Name)
		by := -1
		for j, e := range all {
			if sameDecoder(e.dec, o.dec) && (e.values != nil) == (o.values != nil) {
				by = j
				break
			}
		}
		w.decodedBy = append(w.decodedBy, by)
		w.others = append(w.others, o)
		all = append(all, o)
	}
}

// sameDecoder reports whether a and b are one decoder (projections whose
// reader schemas are the same are given one).
func sameDecoder(a, b Decoder) bool {
	ta := reflect.TypeOf(a)
	return ta != nil && ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// lanes returns the worker and its lanes, in the order of their windows
// and of the lanes a transaction commits.
func (w *Worker) lanes() []*Worker {
	return append([]*Worker{w}, w.others...)
}

// owner is the worker whose fetching and backoff a lane's work pauses.
func (w *Worker) owner() *Worker {
	if w.lead != nil {
		return w.lead
	}
	return w
}

// replayWindows is replay for the windows of every projection of the
// topic (wins, the worker's own first): the lanes' storm guards forget
// the outcomes of their windows too.
func (w *Worker) replayWindows(ctx context.Context, wins []*window, cause error) error {
	for i, o := range w.others {
		o.guard.truncate(wins[i+1].guardStart)
	}
	return w.replay(ctx, wins[0], cause)
}

// lanesCommit checks that a worker with lanes can commit them together.
func (w *Worker) lanesCommit() error {
	if len(w.others) == 0 {
		return nil
	}
	if _, ok := w.sink.(sinks.LaneCommitter); !ok {
		return fmt.Errorf("topic %s feeds %d projections, and the sink of projection %q cannot commit them in one transaction (it is no sinks.LaneCommitter)",
			w.claim.Topic, 1+len(w.others), w.proj.Name)
	}
	return nil
}

// laneBatch is one lane's part of a batch.
type laneBatch struct {
	w        *Worker
	items    []*item
	keys     sinks.Keys
	changes  sinks.Changes
	out      outcomes
	rejected map[string]rejection
	mark     int64 // the lane's storm guard before the batch
}

// processLanes applies recs to every projection of the topic in one
// transaction with the partition's offset: the records are decoded once
// per reader schema, and each projection plans them through its own gate.
//
// A batch that would make a dead-letter storm in any projection halts the
// partition (see storm.go) and is tried again, decoded afresh, every
// RetryCap until it commits.
func (w *Worker) processLanes(ctx context.Context, recs []*kgo.Record) (err error) {
	ctx, span := w.startSpan(ctx, recs)
	defer endSpan(span, &err)
	for attempt := 0; ; attempt++ {
		err := w.processLanesOnce(ctx, recs)
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

// processLanesOnce is one attempt of processLanes.
func (w *Worker) processLanesOnce(ctx context.Context, recs []*kgo.Record) error {
	start := w.claim.NextOffset
	items, end, err := w.items(ctx, recs, start, nil)
	if err != nil || end <= start {
		return err
	}
	lanes := make([]laneBatch, 1+len(w.others))
	lanes[0] = laneBatch{w: w, items: items}
	for i, o := range w.others {
		its := []*item(nil)
		if by := w.decodedBy[i]; by >= 0 {
			its = o.shareDecoded(lanes[by].items)
		} else if its, _, err = o.items(ctx, recs, start, nil); err != nil {
			return err
		}
		lanes[i+1] = laneBatch{w: o, items: its}
	}
	for i := range lanes {
		l := &lanes[i]
		l.keys = batchKeys(l.items, l.w.gaps.has, nil)
		l.rejected = map[string]rejection{}
	}
	return w.commitLanes(ctx, len(recs), lanes, end)
}

// shareDecoded returns the items another lane decoded with this lane's
// decoder, as this lane's: each one's key, version and type are read
// again with this projection's fields, and a record that could not be
// decoded fails here too.
func (w *Worker) shareDecoded(from []*item) []*item {
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
			w.extract(it)
		}
		out[i] = it
	}
	return out
}

// commitLanes is commitBatch for a batch of several projections: every
// lane is planned and written in one transaction with the offset end,
// tried again as commitBatch tries a batch. Rows Postgres refuses
// dead-letter their events in their projection only.
func (w *Worker) commitLanes(ctx context.Context, n int, lanes []laneBatch, end int64) (err error) {
	lc := w.sink.(sinks.LaneCommitter) // checked by lanesCommit
	giveUp := false                    // dead-letter events whose fold keeps failing
	sl := make([]sinks.Lane, len(lanes))
	for i := range lanes {
		l := &lanes[i]
		l.mark = l.w.guard.pos()
		sl[i] = sinks.Lane{Sink: l.w.sink, Keys: l.keys, Plan: func(st sinks.State) (sinks.Changes, error) {
			var err error
			l.changes, l.out, err = l.w.plan(ctx, l.items, l.keys.All, st, nil, l.rejected, giveUp)
			if err != nil {
				return l.changes, err
			}
			// Each projection's storm guard judges its own dead letters:
			// one projection's mistake halts the partition, whose offset
			// all of them share.
			l.w.guard.truncate(l.mark) // planned again: an earlier plan's outcomes go
			if trip := l.w.guard.add(l.items, l.changes.DeadLetters); trip != nil {
				trip.projection = l.w.proj.Name
				return sinks.Changes{}, trip
			}
			return l.changes, nil
		}}
	}
	defer func() {
		if err != nil {
			for i := range lanes {
				lanes[i].w.guard.truncate(lanes[i].mark) // the batch did not commit
			}
		}
	}()
	err = w.retryCommit(ctx, n, &giveUp, func() error { return w.commitLanesTraced(ctx, lc, w.claim, end, sl) },
		func(rej *sinks.RejectedRows) bool {
			if rej.Lane < 0 || rej.Lane >= len(lanes) {
				return false
			}
			l := &lanes[rej.Lane]
			rejections(l.rejected, rej)
			l.w.log.Warn("postgres refused rows; dead-lettering their events", "projection", l.w.proj.Name, "aggregates", len(rej.Keys))
			return true
		})
	if err != nil {
		return err
	}
	w.done()
	var all sinks.Changes // the rows every lane wrote, for Config.Committed
	for i := range lanes {
		l := &lanes[i]
		all.Upserts = append(all.Upserts, l.changes.Upserts...)
		all.Deletes = append(all.Deletes, l.changes.Deletes...)
	}
	w.notifyCommitted(end, all)
	for i := range lanes {
		l := &lanes[i]
		l.w.guard.commit(l.w.guard.pos())
		l.w.moved(end, l.changes, l.out)
	}
	return nil
}

// commitLanesTraced runs the transaction of the lanes, as a child span
// when tracing.
func (w *Worker) commitLanesTraced(ctx context.Context, lc sinks.LaneCommitter, claim sinks.Claim, end int64, lanes []sinks.Lane) error {
	if w.cfg.Tracer == nil {
		return lc.CommitLanes(ctx, claim, end, lanes)
	}
	ctx, span := w.cfg.Tracer.Start(ctx, "commit batch", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system.name", "postgresql"), attribute.String("db.operation.name", "COMMIT"),
			attribute.Int("projector.projections", len(lanes))))
	defer span.End()
	err := lc.CommitLanes(ctx, claim, end, lanes)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
