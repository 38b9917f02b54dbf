package partition

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/sinks"
)

// Fetcher pauses and resumes fetching of partitions (a *kgo.Client).
type Fetcher interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// Push hands fetched records to the worker. It never blocks: past
// MaxBuffered records the worker pauses fetching of its partition until
// it has caught up.
func (w *Worker) Push(recs []*kgo.Record, highWatermark int64) {
	if highWatermark >= 0 {
		w.hwm.Store(highWatermark)
	}
	if len(recs) == 0 {
		return
	}
	w.mu.Lock()
	if w.stopped || w.rewinding {
		w.mu.Unlock()
		return
	}
	if len(w.queue) == 0 && w.oldest.IsZero() {
		w.oldest = recs[0].Timestamp
	}
	w.queue = append(w.queue, recs...)
	if _, buffered := w.limits(); len(w.queue) >= buffered {
		w.paused = true
		w.syncFetch()
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// nextBatch waits for records and gathers up to BatchMaxRecords of them
// (or the worker's share),
// waiting at most BatchMaxWait after the first. ok is false when the worker
// must stop.
func (w *Worker) nextBatch(ctx context.Context, repairs <-chan repaired) (job, bool) {
	var deadline, mark <-chan time.Time
	// One timer for the caught-up marks, reset after each: an idle
	// worker waits here for hours.
	var markTimer *time.Timer
	for {
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		if batchMax, _ := w.limits(); n >= batchMax {
			if w.redriveDue() {
				return job{redrive: true}, true
			}
			break
		}
		var skips <-chan skipRequest
		if n == 0 {
			skips = w.skips // records fetched before the skip go first
			if w.pending == nil {
				w.setIdle(true)
				if mark == nil {
					if markTimer == nil {
						markTimer = time.NewTimer(CaughtUpEvery)
						defer markTimer.Stop()
					} else {
						markTimer.Reset(CaughtUpEvery)
					}
					mark = markTimer.C
				}
			}
		} else if deadline == nil {
			t := time.NewTimer(w.cfg.BatchMaxWait)
			defer t.Stop()
			deadline = t.C
		}
		var settled <-chan struct{}
		if w.pending != nil {
			settled = w.pending.done
		}
		var j job
		select {
		case <-ctx.Done():
			return job{}, false
		case <-w.stop:
			return job{}, false
		case <-w.wake:
			w.setIdle(false)
			continue
		case <-settled:
			j.settle = true
		case r := <-repairs:
			j.repair = &r
		case s := <-skips:
			j.skip = &s
		case <-w.redrive:
			j.redrive = true
		case <-mark:
			w.markCaughtUp(ctx)
			mark = nil
			continue
		case <-deadline:
			w.setIdle(false)
			if w.redriveDue() {
				return job{redrive: true}, true
			}
			return job{recs: w.take()}, true
		}
		w.setIdle(false)
		return j, true
	}
	w.setIdle(false)
	return job{recs: w.take()}, true
}

// CaughtUpEvery is how often an idle worker caught up with its partition
// records so (see sinks.CaughtUpMarker): a reader takes a partition not
// seen caught up for longer to have fallen behind, or its member to
// have stopped.
var CaughtUpEvery = time.Second

// markCaughtUp records that the idle partition is caught up, when the
// high watermark says so. A failure is not worth a line: the next
// commit or mark records it, and until then readers see the partition
// as stale, which it may be.
func (w *Worker) markCaughtUp(ctx context.Context) {
	hwm := w.hwm.Load()
	if hwm < 0 || w.claim.NextOffset < hwm {
		return
	}
	if m, ok := w.lanes[0].sink.(sinks.CaughtUpMarker); ok {
		if err := m.MarkCaughtUp(ctx, w.claim); err != nil {
			w.log.Debug("recording the partition caught up failed", "err", err)
		}
	}
}

// setIdle marks whether the worker waits for records with none in hand;
// the time it stops waiting counts as progress.
func (w *Worker) setIdle(idle bool) {
	if w.idle.Swap(idle) && !idle {
		w.progress.Store(time.Now().UnixNano())
	}
}

// take removes the next batch from the buffer, up to the batch limit in
// effect (nil when the buffer is empty).
func (w *Worker) take() []*kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	batchMax, buffered := w.limits()
	if len(w.queue) == 0 {
		return nil
	}
	n := min(len(w.queue), batchMax)
	batch := make([]*kgo.Record, n)
	copy(batch, w.queue)
	rest := copy(w.queue, w.queue[n:])
	clear(w.queue[rest:])
	w.queue = w.queue[:rest]
	if w.paused && len(w.queue) < buffered/2 {
		w.paused = false
		w.syncFetch()
	}
	return batch
}

// limits returns the most records of one batch and the buffer's bound in
// effect (see Config.Share), the batch smaller while transactions are
// shrunk (see shrink.go).
func (w *Worker) limits() (batchMax, buffered int) {
	batchMax, buffered = w.baseLimits()
	if p := w.partMax.Load(); p > 0 {
		batchMax = min(batchMax, int(p))
	}
	return batchMax, buffered
}

// baseLimits is limits as configured.
func (w *Worker) baseLimits() (batchMax, buffered int) {
	batchMax, buffered = w.cfg.BatchMaxRecords, w.cfg.MaxBuffered
	if w.cfg.Share != nil {
		share := max(w.cfg.Share(), 1)
		batchMax, buffered = min(batchMax, share), min(buffered, share)
	}
	return batchMax, buffered
}

// syncFetch pauses or resumes fetching of the partition so that it is
// paused exactly while the buffer is full, the worker backs off or the
// partition is halted, and
// not once the worker has stopped (the engine resumes a stopped worker's
// partition). Call with mu held: the fetcher's state changes in the order
// the worker's does. Otherwise a pause could overtake the resume that
// followed it (the buffer filled by one goroutine and emptied by another in
// between), and the partition would stay paused for good.
func (w *Worker) syncFetch() {
	want := (w.paused || w.backoffSince.Load() != 0 || w.halted.Load() != nil) && !w.stopped
	if want == w.fetchPaused {
		return
	}
	w.fetchPaused = want
	tp := map[string][]int32{w.claim.Topic: {w.claim.Partition}}
	if want {
		w.fetcher.PauseFetchPartitions(tp)
	} else {
		w.fetcher.ResumeFetchPartitions(tp)
	}
}

// more returns the next batch of win while the worker is behind, a full
// batch or more left in its buffer or in the partition (its high
// watermark): what the buffer holds, or what arrives in time (nil: none,
// or the worker has caught up). A window waits, in all, as long as its
// CommitMaxBatches batches could have waited each (BatchMaxWait):
// fetching a batch takes longer than BatchMaxWait when the processor is
// busy, and a window that ended then would write its aggregates' rows
// again in the next one. A worker that has caught up commits at once:
// records that trickle in would keep its window open, and its rows
// unwritten, for as long as they came.
func (w *Worker) more(ctx context.Context, win *window) []*kgo.Record {
	batchMax, _ := w.limits()
	w.mu.Lock()
	queued := len(w.queue)
	w.mu.Unlock()
	if queued < batchMax && w.hwm.Load()-win.end < int64(batchMax) {
		return nil
	}
	if recs := w.take(); recs != nil {
		return recs
	}
	wait := time.Duration(w.cfg.CommitMaxBatches)*w.cfg.BatchMaxWait - win.waited
	if wait <= 0 {
		return nil
	}
	start := time.Now()
	defer func() { win.waited += time.Since(start) }()
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-w.wake:
			if recs := w.take(); recs != nil {
				return recs
			}
		case <-t.C:
			return nil
		case <-w.stop:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
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

// Rewinder moves the fetch position of a partition back to offset, then
// calls done; records fetched before are not delivered after done.
type Rewinder interface {
	Rewind(tp sinks.TP, offset int64, done func())
}

// replay applies the records of the lanes' windows (wins, in the order of
// the lanes) again, batch by batch, each batch planned in its own
// transaction: the partition is fetched again from the windows' first
// record.
func (w *Worker) replay(ctx context.Context, wins []*window, cause error) error {
	w.metrics.replays.Inc()
	for i, l := range w.lanes {
		l.guard.truncate(wins[i].guardStart) // their records are applied again
	}
	win := wins[0]
	w.log.Info("applying the batches of a transaction again one by one", "reason", cause.Error(),
		"from", win.start, "to", win.end)
	w.mu.Lock()
	clear(w.queue)
	w.queue = w.queue[:0]
	w.rewinding = true
	w.paused = false
	w.syncFetch()
	w.mu.Unlock()
	w.alone = win.end
	done := make(chan struct{})
	w.fetcher.(Rewinder).Rewind(w.claim.TP, win.start, func() {
		w.mu.Lock()
		w.rewinding = false
		w.mu.Unlock()
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.stop:
		return errStopped
	}
}
