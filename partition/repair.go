package partition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/repair"
	"github.com/projector-dev/projector/sinks"
)

// Repairer fetches an aggregate's state at or beyond a missing version
// (package repair has HTTP and SQL ones).
type Repairer interface {
	Repair(ctx context.Context, key string, missing int64) (repair.Result, error)
}

// gaps tracks the aggregates of a partition that have parked events: when
// the oldest was parked, and the repair attempts made so far. The worker
// goroutine writes it after commits; the repair goroutine reads it.
type gaps struct {
	mu   sync.Mutex
	aggs map[string]*gap
}

type gap struct {
	count    int
	since    time.Time
	attempts int // failed attempts that count towards MaxAttempts
	// outage counts the attempts in a row that found the repair source
	// (or Postgres) unavailable: they set the backoff, never a limit.
	outage   int
	nextTry  time.Time
	inFlight bool
}

func (g *gaps) has(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aggs[key] != nil
}

// update applies a committed batch's parks and unparks and returns how
// many aggregates no longer wait.
func (g *gaps) update(parked []sinks.StoredEvent, unparked []sinks.ParkedRef, now time.Time) (closed int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range parked {
		a := g.aggs[p.Key]
		if a == nil {
			a = &gap{since: now}
			g.aggs[p.Key] = a
		}
		a.count++
	}
	for _, u := range unparked {
		if a := g.aggs[u.Key]; a != nil {
			a.count--
			if a.count <= 0 {
				delete(g.aggs, u.Key)
				closed++
			}
		}
	}
	return closed
}

// totals returns the parked event count, the oldest parked time, and how
// many aggregates wait for a repair source that is unavailable.
func (g *gaps) totals() (n int, oldest time.Time, unavailable int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range g.aggs {
		n += a.count
		if oldest.IsZero() || a.since.Before(oldest) {
			oldest = a.since
		}
		if a.outage > 0 {
			unavailable++
		}
	}
	return n, oldest, unavailable
}

// due returns the aggregates parked longer than timeout whose next
// repair attempt is due, marking them in flight.
func (g *gaps) due(now time.Time, timeout time.Duration) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var keys []string
	for k, a := range g.aggs {
		if !a.inFlight && now.Sub(a.since) >= timeout && !now.Before(a.nextTry) {
			a.inFlight = true
			keys = append(keys, k)
		}
	}
	return keys
}

// failed records a failed attempt and when to try again; it returns the
// attempts made.
func (g *gaps) failed(key string, base, ceiling time.Duration) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.aggs[key]
	if a == nil {
		return 0
	}
	a.inFlight, a.outage = false, 0
	a.attempts++
	a.nextTry = time.Now().Add(backoff.Policy{Base: base, Cap: ceiling}.Delay(a.attempts))
	return a.attempts
}

// unavailable records an attempt that found the repair source down and
// when to try again, without counting it towards MaxAttempts; it returns
// the attempts in a row that did.
func (g *gaps) unavailable(key string, base, ceiling time.Duration) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.aggs[key]
	if a == nil {
		return 0
	}
	a.inFlight = false
	a.outage++
	a.nextTry = time.Now().Add(backoff.Policy{Base: base, Cap: ceiling}.Delay(a.outage))
	return a.outage
}

func (g *gaps) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if a := g.aggs[key]; a != nil {
		a.inFlight = false
	}
}

// repaired is the outcome of asking the repairer about one aggregate.
type repaired struct {
	key     string
	missing int64
	result  repair.Result
	err     error
	// loadFailed: Postgres did not answer the aggregate's version, so the
	// repair source was not asked.
	loadFailed bool
}

// repairLoop asks the repairer about aggregates parked longer than the
// projection's gap timeout and hands the answers to the worker goroutine,
// which commits them between batches. Network calls never block batches.
// Only a worker of one lane repairs (a projection that repairs gaps does
// not share its topic): its gaps are the first lane's.
func (w *Worker) repairLoop(ctx context.Context, out chan<- repaired) {
	l := w.lanes[0]
	tick := time.NewTicker(min(l.proj.GapTimeout/4+time.Millisecond, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.stop:
			return
		case <-tick.C:
		}
		for _, key := range l.gaps.due(time.Now(), l.proj.GapTimeout) {
			r := repaired{key: key}
			st, err := l.sink.Load(ctx, w.claim.TP, []string{key})
			if err != nil {
				r.err, r.loadFailed = fmt.Errorf("load %q: %w", clip(key), err), true
			} else {
				r.missing = st.Versions[key] + 1
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				r.result, r.err = w.repairer.Repair(rctx, key, r.missing)
				cancel()
			}
			if ctx.Err() != nil {
				return // stopping: an answer cut short is no answer
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			case <-w.stop:
				return
			}
		}
	}
}

// applyRepair commits a repair answer: the repaired state and the parked
// events that follow it, or the parked events as dead letters with the gap
// in their error when the source has nothing for the gap (ErrNotFound) or
// failed MaxAttempts times otherwise. A source that is unavailable
// (repair.IsTransient), or Postgres not answering, is retried with backoff
// without limit and the events stay parked: an outage never dead-letters.
func (w *Worker) applyRepair(ctx context.Context, r repaired) error {
	l := w.lanes[0]
	if r.err == nil {
		w.repairAnswered()
		return w.commitRepair(ctx, r.key, func(st sinks.State) (sinks.Changes, outcomes, error) {
			return l.planRepair(ctx, r, st)
		}, "repaired")
	}
	var cause error
	switch {
	case r.loadFailed || repair.IsTransient(r.err):
		n := l.gaps.unavailable(r.key, w.cfg.RetryBase, w.cfg.RetryCap)
		w.metrics.repairFailures.WithLabelValues(l.proj.Name, "unavailable").Inc()
		w.repairUnavailable(r, n)
		return nil
	case errors.Is(r.err, repair.ErrNotFound):
		w.repairAnswered()
		w.metrics.repairFailures.WithLabelValues(l.proj.Name, "not_found").Inc()
		w.log.Warn("gap repair: the source has nothing for the gap; dead-lettering its parked events", "key", clip(r.key), "missing", r.missing, "err", r.err)
		cause = fmt.Errorf("gap: version %d of %q never arrived and the repair source has nothing for it: %w", r.missing, clip(r.key), r.err)
	default:
		w.repairAnswered()
		w.metrics.repairFailures.WithLabelValues(l.proj.Name, "failed").Inc()
		attempts := l.gaps.failed(r.key, w.cfg.RetryBase, w.cfg.RetryCap)
		w.log.Warn("gap repair failed", "key", clip(r.key), "missing", r.missing, "attempt", attempts, "err", r.err)
		if attempts < w.cfg.MaxAttempts {
			return nil
		}
		cause = fmt.Errorf("gap: version %d of %q never arrived; repair failed after %d attempts: %w", r.missing, clip(r.key), attempts, r.err)
	}
	return w.commitRepair(ctx, r.key, func(st sinks.State) (sinks.Changes, outcomes, error) {
		return l.planGapDeadLetters(ctx, r.key, st, cause)
	}, "dead_lettered")
}

// repairLogEvery is how often a repair source that stays unavailable is
// logged again: each parked aggregate retries on its own, and an outage
// must be heard once, not once per aggregate and attempt.
const repairLogEvery = time.Minute

// repairUnavailable logs the first failure of an outage of the repair
// source, then at most once per repairLogEvery. Only Run's goroutine
// calls it.
func (w *Worker) repairUnavailable(r repaired, attempt int) {
	l := w.lanes[0]
	now := time.Now()
	if !w.repairDown.IsZero() && now.Sub(w.repairLogged) < repairLogEvery {
		return
	}
	if w.repairDown.IsZero() {
		w.repairDown = now
	}
	_, _, waiting := l.gaps.totals()
	w.repairLogged = now
	w.log.Warn("gap repair source unavailable; parked events stay parked and are retried with backoff",
		"key", clip(r.key), "missing", r.missing, "attempt", attempt, "aggregates_waiting", waiting,
		"down_for", now.Sub(w.repairDown).Round(time.Second), "err", r.err)
}

// repairAnswered ends an outage of the repair source, saying so once.
func (w *Worker) repairAnswered() {
	if w.repairDown.IsZero() {
		return
	}
	w.log.Info("gap repair source answers again", "down_for", time.Since(w.repairDown).Round(time.Second))
	w.repairDown, w.repairLogged = time.Time{}, time.Time{}
}

func (w *Worker) commitRepair(ctx context.Context, key string, plan func(sinks.State) (sinks.Changes, outcomes, error), resolution string) error {
	l := w.lanes[0]
	var (
		ch  sinks.Changes
		out outcomes
	)
	wrapped := func(st sinks.State) (sinks.Changes, error) {
		var err error
		ch, out, err = plan(st)
		return ch, err
	}
	for attempt := 0; ; attempt++ {
		err := l.sink.CommitBatch(ctx, w.claim, w.claim.NextOffset, sinks.Keys{All: []string{key}, Parked: []string{key}}, wrapped)
		if err == nil {
			break
		}
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil {
			return err
		}
		var rej *sinks.RejectedRows
		if errors.As(err, &rej) {
			// The repaired row itself is refused: leave the events parked
			// and try the repair again later.
			l.gaps.failed(key, w.cfg.RetryBase, w.cfg.RetryCap)
			return nil
		}
		if err := w.backoff(ctx, attempt, "commit repair", err); err != nil {
			return err
		}
	}
	w.done()
	w.notifyCommitted(w.claim.NextOffset, 1, func(int) *sinks.Changes { return &ch })
	l.gaps.release(key)
	l.gaps.update(nil, ch.Unpark, time.Now())
	name := l.proj.Name
	if len(ch.Unpark) > 0 || len(ch.Upserts)+len(ch.Deletes) > 0 {
		w.metrics.gaps.WithLabelValues(name, resolution).Inc()
	}
	for class, n := range out.deadLettered {
		w.metrics.deadLetters.WithLabelValues(name, class).Add(float64(n))
	}
	l.logDeadLetters(ch.DeadLetters)
	return nil
}

// planRepair applies a repair result to the aggregate and drains what it
// unblocks.
func (l *lane) planRepair(ctx context.Context, r repaired, st sinks.State) (sinks.Changes, outcomes, error) {
	var (
		ch  sinks.Changes
		out = outcomes{deadLettered: map[string]int{}}
		agg = &aggState{row: st.Rows[r.key]}
	)
	agg.gate.Version = st.Versions[r.key]
	if r.result.Version <= agg.gate.Version {
		return ch, out, nil // filled meanwhile
	}
	for _, ev := range st.Parked {
		it := &item{offset: ev.Offset, recordKey: ev.RecordKey, value: ev.Value, headers: ev.Headers, timestamp: ev.Timestamp, restored: true}
		if err := l.decode(ctx, it); err != nil {
			return ch, out, err
		}
		it.key, it.version = ev.Key, ev.Version
		agg.gate.Restore(ev.Version, it)
	}
	var failed *item
	apply := func(v int64, it *item) error {
		row, err := l.proj.Apply(agg.row, it.event(v))
		if err != nil {
			failed = it
			return err
		}
		agg.row = row
		ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: it.key, Version: v})
		return nil
	}
	drop := func(v int64, it *item) { ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: it.key, Version: v}) }

	if r.result.Snapshot != nil {
		row, err := l.snapshotRow(r.key, r.result.Snapshot)
		if err != nil {
			return ch, out, fmt.Errorf("repaired snapshot of %q: %w", clip(r.key), err)
		}
		agg.row = row
	} else {
		for _, ev := range r.result.Events {
			if ev.Version <= agg.gate.Version {
				continue
			}
			ev.Key = r.key
			row, err := l.proj.Apply(agg.row, ev)
			if err != nil {
				return ch, out, fmt.Errorf("fold repaired event %q v%d: %w", clip(r.key), ev.Version, err)
			}
			agg.row = row
		}
	}
	if err := agg.gate.Jump(r.result.Version, drop, apply); err != nil && failed != nil {
		f := *failed
		f.fail(sinks.ClassFold, fmt.Errorf("fold %q v%d after repair: %w", clip(failed.key), failed.version, err))
		out.deadLettered[f.class]++
		ch.DeadLetters = append(ch.DeadLetters, sinks.DeadLetter{Offset: f.offset, RecordKey: f.recordKey, Value: f.value,
			Headers: f.headers, Timestamp: f.timestamp, Err: f.err.Error(), Class: f.class, Attempts: 1, TraceID: traceID(f.headers)})
		ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: f.key, Version: f.version})
	}
	if agg.row == nil {
		ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: r.key, Version: agg.gate.Version})
	} else {
		ch.Upserts = append(ch.Upserts, sinks.RowWrite{Key: r.key, Version: agg.gate.Version, Row: agg.row})
	}
	return ch, out, nil
}

// snapshotRow turns a repaired snapshot into a row of the projection's
// columns; the key column always holds the aggregate id.
func (l *lane) snapshotRow(key string, snap projection.Row) (projection.Row, error) {
	cols := l.proj.Columns
	row := make(projection.Row, len(cols))
	row[cols[0].Name] = key
	for _, c := range cols[1:] {
		v, ok := snap[c.Name]
		if !ok {
			v = snap[c.Field]
		}
		conv, err := c.Convert(v)
		if err != nil {
			return nil, err
		}
		row[c.Name] = conv
	}
	return row, nil
}

// planGapDeadLetters moves an aggregate's parked events to the DLQ.
func (l *lane) planGapDeadLetters(ctx context.Context, key string, st sinks.State, cause error) (sinks.Changes, outcomes, error) {
	var (
		ch  sinks.Changes
		out = outcomes{deadLettered: map[string]int{}}
	)
	for _, ev := range st.Parked {
		if ev.Key != key {
			continue
		}
		it := &item{offset: ev.Offset, recordKey: ev.RecordKey, value: ev.Value, headers: ev.Headers, timestamp: ev.Timestamp}
		_ = l.decode(ctx, it) // for the schema id; the record is dead-lettered either way
		out.deadLettered[sinks.ClassGap]++
		ch.DeadLetters = append(ch.DeadLetters, sinks.DeadLetter{Offset: ev.Offset, RecordKey: ev.RecordKey, Value: ev.Value,
			Headers: ev.Headers, Timestamp: ev.Timestamp, Err: cause.Error(), Class: sinks.ClassGap, Attempts: l.w.cfg.MaxAttempts,
			SchemaID: it.schemaID, TraceID: traceID(ev.Headers)})
		ch.Unpark = append(ch.Unpark, sinks.ParkedRef{Key: ev.Key, Version: ev.Version})
	}
	return ch, out, nil
}
