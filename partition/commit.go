package partition

import (
	"context"
	"errors"
	"time"

	"github.com/projector-dev/projector/sinks"
)

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

// committed moves the worker past a committed transaction of n lanes
// that ended before offset end: at gives each lane, the changes and
// outcomes of its part of the transaction, and its storm guard's position
// after that part's records.
func (w *Worker) committed(end int64, n int, at func(i int) (l *lane, ch *sinks.Changes, out *outcomes, guardEnd int64)) {
	w.notifyCommitted(end, n, func(i int) *sinks.Changes {
		_, ch, _, _ := at(i)
		return ch
	})
	w.claim.NextOffset = end
	w.next.Store(end)
	w.progress.Store(time.Now().UnixNano())
	w.mu.Lock()
	if len(w.queue) > 0 {
		w.oldest = w.queue[0].Timestamp
	} else {
		w.oldest = time.Time{}
	}
	w.mu.Unlock()
	for i := range n {
		l, ch, out, guardEnd := at(i)
		l.guard.commit(guardEnd)
		l.moved(*ch, *out)
	}
	w.stormOver()
}

// moved moves the lane past its part of a committed transaction, with
// changes and outcomes out: its parked events, metrics and dead letters.
func (l *lane) moved(changes sinks.Changes, out outcomes) {
	w := l.w
	if closed := l.gaps.update(changes.Park, changes.Unpark, time.Now()); closed > 0 {
		w.metrics.gaps.WithLabelValues(l.proj.Name, "filled").Add(float64(closed))
	}
	m := w.metrics.processed
	name, topic := l.proj.Name, w.claim.Topic
	m.WithLabelValues(name, topic, "applied").Add(float64(out.applied))
	m.WithLabelValues(name, topic, "stale").Add(float64(out.stale))
	m.WithLabelValues(name, topic, "parked").Add(float64(out.parked))
	dead := 0
	for class, n := range out.deadLettered {
		dead += n
		w.metrics.deadLetters.WithLabelValues(name, class).Add(float64(n))
	}
	m.WithLabelValues(name, topic, "dead_lettered").Add(float64(dead))
	l.totals.applied.Add(int64(out.applied))
	l.totals.stale.Add(int64(out.stale))
	l.totals.dead.Add(int64(dead))
	l.logDeadLetters(changes.DeadLetters)
}

// notifyCommitted tells Config.Committed, if set, that a transaction
// ending before offset end committed the changes of its n lanes (changes
// gives each).
func (w *Worker) notifyCommitted(end int64, n int, changes func(i int) *sinks.Changes) {
	if w.stored != nil {
		w.stored(end)
	}
	if w.cfg.Committed == nil {
		return
	}
	var keys []string
	rows := 0
	for i := range n {
		ch := changes(i)
		rows += len(ch.Upserts) + len(ch.Deletes)
	}
	if rows > 0 {
		keys = make([]string, 0, rows)
		for i := range n {
			for _, u := range changes(i).Upserts {
				keys = append(keys, u.Key)
			}
		}
		for i := range n {
			for _, d := range changes(i).Deletes {
				keys = append(keys, d.Key)
			}
		}
	}
	w.cfg.Committed(w.claim.TP, end, keys)
}
