package partition

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"

	"github.com/projector-dev/projector/projection"
)

// A worker that is behind commits several batches in one transaction: it
// plans each batch as it comes, on the state the earlier ones left
// (window), and writes each aggregate's row once for all of them. Its
// events are dropped once planned, and their records kept only as bytes
// (held), so that a commit covers more events than a batch holds in
// memory. Should Postgres not be as the batches were planned on (an
// aggregate assumed new exists, a cached row is stale) or refuse a row,
// the window's records are applied again batch by batch, each batch
// planned inside its own transaction.

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
	parked   map[string][]StoredEvent
	unpark   []ParkedRef
	unparked map[ParkedRef]bool
	dead     []DeadLetter
	resolved []int64
	out      outcomes
	held     held
	// Of the aggregates of the last batch, how many the window knew.
	known, seen int
}

// collapsing reports whether the window's last batch shared enough of its
// aggregates with the batches before it for one more to pay: with far
// more aggregates than a batch holds, few share one and the window would
// only hold more rows.
func (win *window) collapsing() bool {
	return len(win.sizes) < 2 || win.known*4 >= win.seen
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

// windowing reports whether the worker is behind, having taken a full
// batch of n records.
func (w *Worker) windowing(n int) bool {
	batchMax, _ := w.limits()
	return w.cfg.CommitMaxBatches > 1 && n >= batchMax
}

// processWindow applies recs and, while records wait after each batch,
// the batches after them in one transaction.
func (w *Worker) processWindow(ctx context.Context, recs []*kgo.Record) (err error) {
	win := &window{start: w.claim.NextOffset, end: w.claim.NextOffset, aggs: map[string]*windowAgg{},
		parked: map[string][]StoredEvent{}, unparked: map[ParkedRef]bool{}}
	ctx, span := w.startSpan(ctx, recs)
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	for first := true; ; first = false {
		if !first {
			w.linkSpan(span, recs)
		}
		err := w.plan1(ctx, win, recs)
		var pf *planFailed
		if errors.As(err, &pf) {
			w.log.Info("applying the batches of a commit again one by one", "reason", pf.Error(), "records", win.held.len())
			return w.replay(ctx, win)
		}
		if err != nil {
			return err
		}
		if len(win.sizes) >= w.cfg.CommitMaxBatches || !win.collapsing() || w.stopping() {
			break
		}
		if recs = w.take(); recs == nil {
			break
		}
	}
	if win.end <= win.start {
		return nil
	}
	return w.commitWindow(ctx, win)
}

// stopping reports whether Stop was called.
func (w *Worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// plan1 plans one batch of the window.
func (w *Worker) plan1(ctx context.Context, win *window, recs []*kgo.Record) error {
	items, end, err := w.items(ctx, recs, win.end)
	if err != nil || end <= win.end {
		return err
	}
	win.held.add(recs, win.end)
	keys := batchKeys(items, w.gaps.has)
	// Aggregates the window knows are not read again; the others are.
	aggs := make([]*windowAgg, len(keys.All)) // of keys.All, in order
	isNew := make([]bool, len(keys.All))
	var peek Keys
	n := 0 // keys.New is in the order of keys.All
	for i, k := range keys.All {
		if n < len(keys.New) && keys.New[n] == k {
			isNew[i] = true
			n++
		}
		if aggs[i] = win.aggs[k]; aggs[i] == nil {
			peek.All = append(peek.All, k)
			if isNew[i] {
				peek.New = append(peek.New, k)
			}
		}
	}
	peek.Parked = keys.Parked
	var known State
	err = w.retry(ctx, "read the state of a batch", func() (err error) {
		known, err = w.sink.Peek(ctx, w.claim, peek)
		return err
	})
	if err != nil {
		return err
	}
	// The plan folds into the window's rows: should it fail (a fold to be
	// retried, the registry down while parked events are decoded), the
	// window is applied again batch by batch, each batch retried as it
	// would be on its own.
	st := State{
		Rows:     make(map[string]projection.Row, len(keys.All)),
		Versions: make(map[string]int64, len(keys.All)),
		Parked:   known.Parked,
	}
	for i, k := range keys.All {
		st.Parked = append(st.Parked, win.parked[k]...)
		a := aggs[i]
		if a == nil {
			v, has := known.Versions[k]
			row := known.Rows[k]
			a = &windowAgg{key: k, baseVersion: v, baseExists: row != nil, assumed: isNew[i] && !has && row == nil, version: v, row: row}
			aggs[i] = a
			win.aggs[k] = a
			win.list = append(win.list, a)
		}
		if a.version != 0 {
			st.Versions[k] = a.version
		}
		if a.row != nil {
			st.Rows[k] = a.row
		}
	}
	changes, out, err := w.plan(ctx, items, keys.All, st, nil, false)
	if err != nil {
		return &planFailed{err}
	}
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
	win.sizes = append(win.sizes, len(recs))
	win.known = len(keys.All) - len(peek.All)
	win.seen = len(keys.All)
	win.out.add(out)
	// An event the window parked that no longer waits was never stored;
	// one parked earlier is unparked once, however many batches read it.
	for _, u := range changes.Unpark {
		if evs := win.parked[u.Key]; len(evs) > 0 {
			if i := slices.IndexFunc(evs, func(e StoredEvent) bool { return e.Version == u.Version }); i >= 0 {
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

// commitWindow writes the window's rows, parked events and dead letters
// and the offset after the window in one transaction. When Postgres
// contradicts the state the window was planned on, or refuses a row, the
// window's records are applied again batch by batch.
func (w *Worker) commitWindow(ctx context.Context, win *window) error {
	ch := Changes{Unpark: win.unpark, DeadLetters: win.dead, Resolved: win.resolved}
	for _, evs := range win.parked {
		ch.Park = append(ch.Park, evs...)
	}
	keys := Keys{Planned: true}
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
			ch.Deletes = append(ch.Deletes, RowDelete{Key: a.key, Version: a.version})
		default:
			ch.Upserts = append(ch.Upserts, RowWrite{Key: a.key, Version: a.version, Row: a.row})
		}
	}
	plan := func(st State) (Changes, error) {
		for _, a := range checked {
			if st.Versions[a.key] != a.baseVersion || (st.Rows[a.key] != nil) != a.baseExists {
				return Changes{}, fmt.Errorf("%q: %w", a.key, errWindowStale)
			}
		}
		return ch, nil
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := w.commitTraced(ctx, win.end, keys, plan)
		if err == nil {
			w.metrics.commitDuration.Observe(time.Since(began).Seconds())
			for _, n := range win.sizes {
				w.metrics.batchRecords.Observe(float64(n))
			}
			w.metrics.commitBatches.Observe(float64(len(win.sizes)))
			break
		}
		if errors.Is(err, ErrFenced) || ctx.Err() != nil {
			return err
		}
		var rej *RejectedRows
		if errors.Is(err, errWindowStale) || errors.As(err, &rej) {
			w.log.Info("applying the batches of a commit again one by one", "reason", err.Error(), "records", win.held.len())
			return w.replay(ctx, win)
		}
		if err := w.backoff(ctx, attempt, "commit batches", err); err != nil {
			return err
		}
	}
	w.done()
	w.committed(win.end, ch, win.out)
	return nil
}

// replay applies the window's records again, batch by batch, each batch
// planned in its own transaction.
func (w *Worker) replay(ctx context.Context, win *window) error {
	w.metrics.replays.Inc()
	recs := win.held.records(w.claim.TP)
	batchMax, _ := w.limits()
	for len(recs) > 0 {
		n := min(len(recs), batchMax)
		if err := w.process(ctx, recs[:n]); err != nil {
			return err
		}
		recs = recs[n:]
	}
	if w.claim.NextOffset < win.end {
		// The window ended in transaction markers only.
		return w.skipTo(ctx, win.end)
	}
	return nil
}

// skipTo stores end as the next offset, with nothing else to commit.
func (w *Worker) skipTo(ctx context.Context, end int64) error {
	err := w.retry(ctx, "commit offset", func() error {
		return w.sink.CommitBatch(ctx, w.claim, end, Keys{}, func(State) (Changes, error) { return Changes{}, nil })
	})
	if err == nil {
		w.committed(end, Changes{}, outcomes{})
	}
	return err
}

// held keeps records as bytes, in chunks without pointers for the
// garbage collector to follow, to rebuild them when a window is replayed.
type held struct {
	chunks [][]byte
	recs   []heldRecord
}

// heldChunk is the size of a chunk of held bytes (larger records get one
// of their own).
const heldChunk = 256 << 10

type heldRecord struct {
	offset, unixNano int64
	key, value       span
	headers          span // each header's key and value, length first
}

// span is bytes of a chunk; n < 0 is nil.
type span struct{ chunk, off, n int32 }

func (h *held) len() int { return len(h.recs) }

func (h *held) put(b []byte) span {
	if b == nil {
		return span{n: -1}
	}
	last := len(h.chunks) - 1
	if last < 0 || len(h.chunks[last])+len(b) > cap(h.chunks[last]) {
		h.chunks = append(h.chunks, make([]byte, 0, max(heldChunk, len(b))))
		last++
	}
	c := h.chunks[last]
	s := span{chunk: int32(last), off: int32(len(c)), n: int32(len(b))}
	h.chunks[last] = append(c, b...)
	return s
}

func (h *held) get(s span) []byte {
	if s.n < 0 {
		return nil
	}
	return h.chunks[s.chunk][s.off : s.off+s.n : s.off+s.n]
}

// add keeps the records of recs from offset start on, but transaction
// markers.
func (h *held) add(recs []*kgo.Record, start int64) {
	var hb []byte
	for _, r := range recs {
		if r.Offset < start || r.Attrs.IsControl() {
			continue
		}
		hr := heldRecord{offset: r.Offset, unixNano: r.Timestamp.UnixNano()}
		hr.key, hr.value = h.put(r.Key), h.put(r.Value)
		hr.headers = span{n: -1}
		if len(r.Headers) > 0 {
			hb = hb[:0]
			for _, hd := range r.Headers {
				hb = binary.AppendUvarint(hb, uint64(len(hd.Key)))
				hb = append(hb, hd.Key...)
				hb = binary.AppendUvarint(hb, uint64(len(hd.Value)))
				hb = append(hb, hd.Value...)
			}
			hr.headers = h.put(hb)
		}
		h.recs = append(h.recs, hr)
	}
}

// records rebuilds the held records of tp.
func (h *held) records(tp TP) []*kgo.Record {
	out := make([]*kgo.Record, 0, len(h.recs))
	for _, hr := range h.recs {
		r := &kgo.Record{
			Topic: tp.Topic, Partition: tp.Partition, Offset: hr.offset,
			Key: h.get(hr.key), Value: h.get(hr.value), Timestamp: time.Unix(0, hr.unixNano),
		}
		for hb := h.get(hr.headers); len(hb) > 0; {
			var hd kgo.RecordHeader
			n, l := binary.Uvarint(hb)
			hd.Key, hb = string(hb[l:l+int(n)]), hb[l+int(n):]
			n, l = binary.Uvarint(hb)
			hd.Value, hb = hb[l:l+int(n):l+int(n)], hb[l+int(n):]
			r.Headers = append(r.Headers, hd)
		}
		out = append(out, r)
	}
	return out
}
