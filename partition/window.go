package partition

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// A worker that is behind commits several batches in one transaction: it
// plans each batch as it comes, on the state the earlier ones left
// (window), and writes each aggregate's row once for all of them. Its
// events are dropped once planned, so that a transaction covers more
// events than a batch holds in memory. Should Postgres not be as the
// batches were planned on (an aggregate assumed new exists, a cached row
// is stale) or refuse a row, or a plan fail, nothing is written: the
// partition is fetched again from the window's first record and applied
// batch by batch, each batch planned inside its own transaction. A window
// that writes nothing the next one reads but rows commits while the
// worker plans the next one on the state it leaves (see launch and
// settle).

// errWindowStale reports a window whose commit found an aggregate's state
// in Postgres other than the one its batches were planned on.
var errWindowStale = errors.New("an aggregate's state in Postgres is not what the batches were planned on")

// planFailed reports a batch of a window whose plan failed.
type planFailed struct{ err error }

func (p *planFailed) Error() string { return "plan: " + p.err.Error() }

func (p *planFailed) Unwrap() error { return p.err }

// window is the open transaction of a worker that is behind.
type window struct {
	start, end int64
	sizes      []int // records of each batch
	aggs       map[string]*windowAgg
	list       []*windowAgg // aggs in the order they entered
	// What the window writes besides rows: the events still parked that
	// its batches parked (by aggregate), the parked events of earlier
	// transactions that no longer wait, dead letters, resolved ones.
	parked   map[string][]sinks.StoredEvent
	unpark   []sinks.ParkedRef
	unparked map[sinks.ParkedRef]bool
	dead     []sinks.DeadLetter
	resolved []int64
	out      outcomes
	// waited is how long the window has waited for its batches.
	waited time.Duration
	// guardStart and guardEnd are the storm guard's positions before and
	// after the outcomes of the window's records (see stormGuard).
	guardStart, guardEnd int64
}

// windowAgg is one aggregate of a window: its state when it entered it
// (base) and after the window's batches.
type windowAgg struct {
	key         string
	baseVersion int64
	baseExists  bool
	assumed     bool // new: its base was not read (see Keys.New)

	version int64
	row     projection.Row
	dirty   bool
	deleted bool
}

// records is how many records the window's batches hold.
func (win *window) records() int {
	n := 0
	for _, size := range win.sizes {
		n += size
	}
	return n
}

// windowing reports whether the worker is behind, having taken a full
// batch of n records, and may commit it with the batches after it: its
// lanes' sinks peek and its fetcher rewinds, and it is not applying a
// replayed window's records again.
func (w *Worker) windowing(n int) bool {
	for _, l := range w.lanes {
		if l.peeker == nil {
			return false
		}
	}
	_, rewinds := w.fetcher.(Rewinder)
	if !rewinds || w.commitMaxBatches() <= 1 || w.claim.NextOffset < w.alone {
		return false
	}
	batchMax, _ := w.limits()
	return n >= batchMax
}

// processWindow applies recs and, while records wait after each batch,
// the batches after them in one transaction, which commits while the
// worker plans the next window (see launch).
func (w *Worker) processWindow(ctx context.Context, recs []*kgo.Record) (err error) {
	start := w.claim.NextOffset
	if w.pending != nil {
		start = w.pending.wins[0].end
	}
	// One window per lane (see lanes.go).
	wins := make([]*window, len(w.lanes))
	for i, l := range w.lanes {
		// Room for the aggregates of a batch or two, which a window of
		// batches sharing aggregates seldom outgrows by much.
		wins[i] = &window{start: start, end: start, aggs: make(map[string]*windowAgg, 2*len(recs)),
			list: make([]*windowAgg, 0, 2*len(recs)), parked: map[string][]sinks.StoredEvent{}, unparked: map[sinks.ParkedRef]bool{}}
		wins[i].guardStart = l.guard.pos()
		wins[i].guardEnd = wins[i].guardStart
	}
	win := wins[0]
	ctx, span := w.startSpan(ctx, recs)
	launched := false
	defer func() {
		if !launched {
			endSpan(span, &err)
		}
	}()
	for first := true; ; first = false {
		if !first {
			w.linkSpan(span, recs)
		}
		if err := w.throttle(ctx, len(recs)); err != nil {
			return err
		}
		err := w.planBatches(ctx, wins, recs)
		var pf *planFailed
		if errors.As(err, &pf) {
			// The records are applied again from the window's first,
			// after the window before it has landed.
			if ok, err := w.settle(ctx); !ok || err != nil {
				return err
			}
			w.done()
			return w.replay(ctx, wins, pf)
		}
		if err != nil {
			return err
		}
		if w.windowFull(wins) || w.stopping() || w.throttled() {
			break
		}
		if recs = w.more(ctx, win); recs == nil {
			break
		}
	}
	if win.end <= win.start {
		return nil
	}
	n := 0
	for _, size := range win.sizes {
		n += size
	}
	span.SetAttributes(attribute.Int("messaging.batch.message_count", n))
	if ok, err := w.settle(ctx); !ok || err != nil {
		return err // the window before did not commit as planned: this one is void
	}
	w.launch(ctx, wins, span)
	launched = true
	return nil
}

// windowFull reports whether win holds as many records as
// CommitMaxBatches full batches, or as many aggregates as the partition
// may hold records (its share of the member's bound, two batches at
// least): the rows a member's transactions hold stay within what it may
// hold of records (twice that while a transaction commits as the next is
// planned, see launch). With many more aggregates than that, the batches of a
// transaction share few of them and it ends early, so that its rows do not
// grow with the aggregates.
func (w *Worker) windowFull(wins []*window) bool {
	batchMax, _ := w.limits()
	n := 0
	for _, size := range wins[0].sizes {
		n += size
	}
	aggs := 2 * batchMax
	if w.cfg.Share != nil {
		aggs = max(aggs, 2*w.cfg.Share())
	}
	if n >= w.commitMaxBatches()*batchMax {
		return true
	}
	for _, win := range wins {
		if len(win.list) >= aggs {
			return true
		}
	}
	return false
}

// planBatches plans one batch into the window of each lane (wins, in the
// order of the lanes), decoding it once per reader schema.
func (w *Worker) planBatches(ctx context.Context, wins []*window, recs []*kgo.Record) error {
	start := wins[0].end
	var (
		end int64
		err error
		one [1][]*item
	)
	items := one[:] // by lane
	if len(w.lanes) > 1 {
		items = make([][]*item, len(w.lanes))
	}
	for i, l := range w.lanes {
		switch {
		case l.decodedBy >= 0:
			items[i] = l.shareDecoded(items[l.decodedBy])
		case i == 0:
			if items[i], end, err = l.items(ctx, recs, start, &l.batchMem); err != nil || end <= start {
				return err
			}
		default:
			if items[i], _, err = l.items(ctx, recs, start, &l.batchMem); err != nil {
				return err
			}
		}
	}
	for i, l := range w.lanes {
		if err := l.planBatch(ctx, wins[i], items[i], end, len(recs)); err != nil {
			return err
		}
	}
	return nil
}

// planBatch plans the items of one batch of records records, ending
// before offset end, into the window.
func (l *lane) planBatch(ctx context.Context, win *window, items []*item, end int64, records int) error {
	w := l.w
	keys := batchKeys(items, l.gaps.has, l.keys())
	// Aggregates the window knows are not read again; the others are.
	aggs := make([]*windowAgg, len(keys.All)) // of keys.All, in order
	isNew := make([]bool, len(keys.All))
	var peek sinks.Keys
	n := 0 // keys.New is in the order of keys.All
	for i, k := range keys.All {
		if n < len(keys.New) && keys.New[n] == k {
			isNew[i] = true
			n++
		}
		if aggs[i] = win.aggs[k]; aggs[i] == nil {
			if aggs[i] = l.carried(k); aggs[i] != nil {
				win.aggs[k] = aggs[i]
				win.list = append(win.list, aggs[i])
				continue
			}
			peek.All = append(peek.All, k)
			if isNew[i] {
				peek.New = append(peek.New, k)
			}
		}
	}
	peek.Parked = keys.Parked
	var (
		known   sinks.State
		refused error // the read fails so however often it is tried
	)
	err := w.retry(ctx, "read the state of a batch", func() (err error) {
		known, err = l.peeker.Peek(ctx, w.claim, peek)
		if errors.Is(err, sinks.ErrRefusedData) {
			refused = err
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	if refused != nil {
		return &planFailed{refused} // applied batch by batch, the batch's records are isolated
	}
	// The plan folds into the window's rows: should it fail (a fold to be
	// retried, the registry down while parked events are decoded), the
	// window is applied again batch by batch, each batch retried as it
	// would be on its own.
	st := sinks.State{Parked: l.stillParked(known.Parked, win)}
	for i, k := range keys.All {
		st.Parked = append(st.Parked, win.parked[k]...)
		st.Parked = l.carriedParked(st.Parked, win, k)
		a := aggs[i]
		if a == nil {
			v, has := known.Versions[k]
			row := known.Rows[k]
			a = &windowAgg{key: k, baseVersion: v, baseExists: row != nil, assumed: isNew[i] && !has && row == nil, version: v, row: row}
			aggs[i] = a
			win.aggs[k] = a
			win.list = append(win.list, a)
		}
	}
	changes, out, err := l.plan(ctx, items, keys.All, st, aggs, nil, false)
	if err != nil {
		return &planFailed{err}
	}
	if trip := l.guard.add(items, changes.DeadLetters); trip != nil {
		// Applied batch by batch, the batch halts the partition (see
		// process) after those before it have committed: the replay
		// covers it.
		win.end = end
		return &planFailed{trip}
	}
	win.guardEnd = l.guard.pos()
	// Upserts and deletes come in the order of keys.All.
	i := 0
	for _, u := range changes.Upserts {
		for keys.All[i] != u.Key {
			i++
		}
		a := aggs[i]
		a.version, a.row, a.dirty, a.deleted = u.Version, u.Row, true, false
	}
	i = 0
	for _, d := range changes.Deletes {
		for keys.All[i] != d.Key {
			i++
		}
		a := aggs[i]
		a.version, a.row, a.dirty, a.deleted = d.Version, nil, true, true
	}
	win.end = end
	win.sizes = append(win.sizes, records)
	win.out.add(out)
	// An event the window parked that no longer waits was never stored;
	// one parked earlier is unparked once, however many batches read it.
	for _, u := range changes.Unpark {
		if evs := win.parked[u.Key]; len(evs) > 0 {
			if i := slices.IndexFunc(evs, func(e sinks.StoredEvent) bool { return e.Version == u.Version }); i >= 0 {
				if win.parked[u.Key] = slices.Delete(evs, i, i+1); len(win.parked[u.Key]) == 0 {
					delete(win.parked, u.Key)
				}
				continue
			}
		}
		if !win.unparked[u] {
			win.unparked[u] = true
			win.unpark = append(win.unpark, u)
		}
	}
	for _, e := range changes.Park {
		win.parked[e.Key] = append(win.parked[e.Key], e)
	}
	win.dead = append(win.dead, changes.DeadLetters...)
	win.resolved = append(win.resolved, changes.Resolved...)
	return nil
}

// windowCommit is what a window's transaction writes.
type windowCommit struct {
	ch   sinks.Changes
	keys sinks.Keys
	plan func(sinks.State) (sinks.Changes, error)
}

// commit returns what win's transaction writes: its rows, parked
// events and dead letters and the offset after it. Its plan refuses the
// transaction when Postgres does not hold what the window was planned on.
func (win *window) commit() windowCommit {
	ch := sinks.Changes{Unpark: win.unpark, DeadLetters: win.dead, Resolved: win.resolved}
	for _, evs := range win.parked {
		ch.Park = append(ch.Park, evs...)
	}
	keys := sinks.Keys{Planned: true, All: make([]string, 0, len(win.list))}
	ch.Upserts = make([]sinks.RowWrite, 0, len(win.list))
	checked := make([]*windowAgg, 0, len(win.list))
	for _, a := range win.list {
		// Every aggregate assumed new is checked, written or not: had it
		// existed, its events might have been stale rather than applied,
		// parked or dead-lettered. Those written the sink verifies by
		// their inserts, the others it reads.
		if !a.dirty && !a.assumed {
			continue
		}
		checked = append(checked, a)
		keys.All = append(keys.All, a.key)
		if a.assumed && a.dirty {
			keys.New = append(keys.New, a.key)
		}
		switch {
		case !a.dirty:
		case a.deleted:
			ch.Deletes = append(ch.Deletes, sinks.RowDelete{Key: a.key, Version: a.version})
		default:
			ch.Upserts = append(ch.Upserts, sinks.RowWrite{Key: a.key, Version: a.version, Row: a.row})
		}
	}
	plan := func(st sinks.State) (sinks.Changes, error) {
		for _, a := range checked {
			if st.Versions[a.key] != a.baseVersion || (st.Rows[a.key] != nil) != a.baseExists {
				return sinks.Changes{}, fmt.Errorf("%q (planned on v%d, row %v; found v%d, row %v): %w",
					a.key, a.baseVersion, a.baseExists, st.Versions[a.key], st.Rows[a.key] != nil, errWindowStale)
			}
		}
		return ch, nil
	}
	return windowCommit{ch: ch, keys: keys, plan: plan}
}

// commitLoop commits win's transaction, first handling err, the failure
// of an attempt made already (nil: none). Transient failures are retried
// with backoff. When Postgres contradicts the state the window was
// planned on, or refuses a row or other data, the window's records are
// applied again batch by batch, and replayed is true.
func (w *Worker) commitLoop(ctx context.Context, wins []*window, wcs []windowCommit, err error) (replayed bool, _ error) {
	win := wins[0]
	for attempt := 0; ; attempt++ {
		if err == nil {
			began := time.Now()
			if err = w.commitWindows(ctx, w.claim, win.end, wcs); err == nil {
				w.windowCommitted(wins, wcs, time.Since(began))
				return false, nil
			}
		}
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil {
			return false, err
		}
		var rej *sinks.RejectedRows
		if errors.Is(err, errWindowStale) || errors.As(err, &rej) || errors.Is(err, sinks.ErrRefusedData) {
			w.done()
			return true, w.replay(ctx, wins, err)
		}
		var lim *sinks.LimitError
		if errors.As(err, &lim) && w.shrinkFor(lim, len(win.sizes), win.records()) {
			w.done()
			return true, w.replay(ctx, wins, err)
		}
		if err := w.backoffPlanned(ctx, attempt, "commit batches", err); err != nil {
			return false, err
		}
		err = nil
	}
}

// commitWindows runs the transaction of the lanes' windows (wcs, in the
// order of the lanes) under claim.
func (w *Worker) commitWindows(ctx context.Context, claim sinks.Claim, end int64, wcs []windowCommit) error {
	lanes := make([]sinks.Lane, len(wcs))
	for i, l := range w.lanes {
		lanes[i] = sinks.Lane{Sink: l.sink, Keys: wcs[i].keys, Plan: wcs[i].plan}
	}
	return w.commitAs(ctx, claim, end, lanes)
}

// windowCommitted moves the worker and its lanes past the committed
// transaction of wins, which took took.
func (w *Worker) windowCommitted(wins []*window, wcs []windowCommit, took time.Duration) {
	win := wins[0]
	w.metrics.commitDuration.Observe(took.Seconds())
	for _, n := range win.sizes {
		w.metrics.batchRecords.Observe(float64(n))
	}
	w.metrics.commitBatches.Observe(float64(len(win.sizes)))
	w.done()
	w.grown()
	w.committed(win.end, len(wins), func(i int) (*lane, *sinks.Changes, *outcomes, int64) {
		return w.lanes[i], &wcs[i].ch, &wins[i].out, wins[i].guardEnd
	})
}

// pendingCommit is the transaction of a window that commits while its
// worker plans the next one.
type pendingCommit struct {
	wins []*window // by lane
	wcs  []windowCommit
	span trace.Span
	done chan struct{} // closed when the attempt has returned
	err  error
	took time.Duration
}

// launch begins win's transaction and returns: the worker plans the next
// window meanwhile, on the state win leaves (see carried and
// carriedParked), and settles win's transaction before it commits
// anything else, repairs or skips a gap, or waits for records. The two
// use the processor and Postgres at once, where a worker that committed
// each window before planning the next used one while the other waited.
func (w *Worker) launch(ctx context.Context, wins []*window, span trace.Span) {
	wcs := make([]windowCommit, len(wins))
	for i, win := range wins {
		wcs[i] = win.commit()
	}
	p := &pendingCommit{wins: wins, wcs: wcs, span: span, done: make(chan struct{})}
	claim := w.claim
	go func() {
		defer close(p.done)
		began := time.Now()
		p.err = w.commitWindows(ctx, claim, wins[0].end, wcs)
		p.took = time.Since(began)
	}()
	w.pending = p // each lane plans the next window on the state its window leaves
}

// settle waits for the transaction launch began, if any, and completes
// it: committed, the worker moves past it; failed, it is retried or its
// window's records are applied again, as a transaction committed in turn
// would be. ok is false when it did not commit as planned: whatever was
// planned on it is void (its records are fetched again), or err says why
// the worker stops.
func (w *Worker) settle(ctx context.Context) (ok bool, err error) {
	p := w.pending
	if p == nil {
		return true, nil
	}
	w.pending = nil
	<-p.done
	if p.err == nil {
		w.windowCommitted(p.wins, p.wcs, p.took)
		p.span.End()
		return true, nil
	}
	replayed, err := w.commitLoop(ctx, p.wins, p.wcs, p.err)
	endSpan(p.span, &err)
	return !replayed && err == nil, err
}

// carried returns the aggregate of the window whose transaction is
// pending as the next window starts from it (nil: not one of its): at the
// version and with a copy of the row the pending one writes, known, as
// that transaction checks or writes it.
func (l *lane) carried(key string) *windowAgg {
	pw := l.pendingWin()
	if pw == nil {
		return nil
	}
	pa := pw.aggs[key]
	if pa == nil {
		return nil
	}
	exists := pa.row != nil && !pa.deleted
	var row projection.Row
	if exists {
		row = maps.Clone(pa.row)
	}
	return &windowAgg{key: key, baseVersion: pa.version, baseExists: exists, version: pa.version, row: row}
}

// carriedParked appends to evs the events of key that the pending window
// parks, which its transaction stores, and win has not unparked since: to
// the next window they are parked events as those it reads (one it
// applies it unparks, after that transaction has stored it).
func (l *lane) carriedParked(evs []sinks.StoredEvent, win *window, key string) []sinks.StoredEvent {
	pw := l.pendingWin()
	if pw == nil {
		return evs
	}
	for _, e := range pw.parked[key] {
		if !win.unparked[sinks.ParkedRef{Key: key, Version: e.Version}] {
			evs = append(evs, e)
		}
	}
	return evs
}

// stillParked leaves out of evs, parked events read from the sink, those
// win or the pending window has unparked already (applied, superseded or
// dead-lettered): the sink holds them until those transactions commit.
func (l *lane) stillParked(evs []sinks.StoredEvent, win *window) []sinks.StoredEvent {
	pw := l.pendingWin()
	return slices.DeleteFunc(evs, func(e sinks.StoredEvent) bool {
		ref := sinks.ParkedRef{Key: e.Key, Version: e.Version}
		return win.unparked[ref] || (pw != nil && pw.unparked[ref])
	})
}

// pendingWin is the lane's window of the transaction committing while the
// worker plans the next one (nil: none).
func (l *lane) pendingWin() *window {
	if p := l.w.pending; p != nil {
		return p.wins[l.i]
	}
	return nil
}
