package partition

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/sinks"
)

// commitBatch plans the items of a batch of n records inside its own
// transaction and commits them with the offset end. A transient failure
// tries again after a backoff; rows Postgres refuses dead-letter their
// aggregates' events on the next attempt, and a fold that keeps failing
// dead-letters its event after MaxAttempts. A plan that would make a
// dead-letter storm is not committed: commitBatch returns its
// *stormTrip.
func (w *Worker) commitBatch(ctx context.Context, n int, items []*item, end int64, keys sinks.Keys) (err error) {
	var (
		out      outcomes
		changes  sinks.Changes
		rejected = map[string]rejection{}
		giveUp   bool // dead-letter events whose fold keeps failing
	)
	mark := w.guard.pos()
	defer func() {
		if err != nil {
			w.guard.truncate(mark) // the batch did not commit
		}
	}()
	plan := func(st sinks.State) (sinks.Changes, error) {
		var err error
		changes, out, err = w.plan(ctx, items, keys.All, st, nil, rejected, giveUp)
		if err != nil {
			return changes, err
		}
		w.guard.truncate(mark) // planned again: an earlier plan's outcomes go
		if trip := w.guard.add(items, changes.DeadLetters); trip != nil {
			return sinks.Changes{}, trip
		}
		return changes, nil
	}
	err = w.retryCommit(ctx, n, &giveUp, func() error { return w.commitTraced(ctx, end, keys, plan) },
		func(rej *sinks.RejectedRows) bool {
			rejections(rejected, rej)
			w.log.Warn("postgres refused rows; dead-lettering their events", "aggregates", len(rej.Keys))
			return true
		})
	if err != nil {
		return err
	}
	w.done()
	w.guard.commit(w.guard.pos())
	w.committed(end, changes, out)
	return nil
}

// retryCommit runs commit, the transaction of a batch of n records, until
// it commits: a transient failure is tried again after a backoff, rows
// Postgres refused go to refused (which reports whether it took them: the
// next plan dead-letters their events), and giveUp is set once a fold
// has failed MaxAttempts-1 times, so that the next plan dead-letters its
// event. A fenced or storming plan, data Postgres refuses
// (sinks.ErrRefusedData), or the end of ctx, ends it.
func (w *Worker) retryCommit(ctx context.Context, n int, giveUp *bool, commit func() error, refused func(*sinks.RejectedRows) bool) error {
	folds := 0
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := commit()
		if err == nil {
			w.metrics.commitDuration.Observe(time.Since(began).Seconds())
			w.metrics.batchRecords.Observe(float64(n))
			w.metrics.commitBatches.Observe(1)
			w.grown()
			return nil
		}
		var trip *stormTrip
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil || errors.As(err, &trip) {
			return err
		}
		var rej *sinks.RejectedRows
		if errors.As(err, &rej) && refused(rej) {
			continue
		}
		if errors.Is(err, sinks.ErrRefusedData) {
			return err // the same again would fail the same way (see isolate.go)
		}
		if lim := (*sinks.LimitError)(nil); n > 1 && errors.As(err, &lim) {
			return err // too big for Postgres: applied in smaller parts (see shrink.go)
		}
		var fr *foldRetry
		if errors.As(err, &fr) {
			folds++
			*giveUp = folds+1 >= w.cfg.MaxAttempts
		}
		if err := w.backoffPlanned(ctx, attempt, "commit batch", err); err != nil {
			return err
		}
	}
}

// committed moves the worker past a committed transaction that ended
// before offset end, with changes and outcomes out.
func (w *Worker) committed(end int64, changes sinks.Changes, out outcomes) {
	w.notifyCommitted(end, changes)
	w.moved(end, changes, out)
}

// moved is committed but for telling Config.Committed, which a worker
// with lanes tells once for all of them.
func (w *Worker) moved(end int64, changes sinks.Changes, out outcomes) {
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
	w.totals.applied.Add(int64(out.applied))
	w.totals.stale.Add(int64(out.stale))
	w.totals.dead.Add(int64(dead))
	w.logDeadLetters(changes.DeadLetters)
	w.stormOver()
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

// notifyCommitted tells Config.Committed, if set, that a transaction
// ending before offset end committed changes.
func (w *Worker) notifyCommitted(end int64, changes sinks.Changes) {
	if w.cfg.Committed == nil {
		return
	}
	var keys []string
	if n := len(changes.Upserts) + len(changes.Deletes); n > 0 {
		keys = make([]string, 0, n)
		for _, u := range changes.Upserts {
			keys = append(keys, u.Key)
		}
		for _, d := range changes.Deletes {
			keys = append(keys, d.Key)
		}
	}
	w.cfg.Committed(w.claim.TP, end, keys)
}
