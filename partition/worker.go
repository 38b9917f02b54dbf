package partition

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Decoder turns a record value into the projection's reader schema.
type Decoder interface {
	Decode(ctx context.Context, value []byte) (map[string]any, int, error)
}

// ValuesDecoder is a Decoder that can also write a record's fields into
// values the caller provides, Width of them, in the order of the names it
// returns (a *schemas.Decoder with a reader schema); a record it cannot
// decode so it returns as a map, names nil. A worker whose projection's
// fold reads events through projection.Event.Field decodes batches with
// it: one slice for a batch's values instead of a map per event.
type ValuesDecoder interface {
	Decoder
	Width() int
	DecodeValues(ctx context.Context, value []byte, vals []any) (names []string, rec map[string]any, id int, err error)
}

// Fetcher pauses and resumes fetching of partitions (a *kgo.Client).
type Fetcher interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// DefaultBatchMaxRecords is the most records one batch holds unless told
// otherwise. A worker that is behind commits many batches in one
// transaction (DefaultCommitMaxBatches), so how many of an aggregate's
// events collapse into one row write depends on the transaction rather
// than the batch; smaller batches hold less memory, and larger ones did
// not go faster (see docs/performance.md).
const DefaultBatchMaxRecords = 2000

// DefaultCommitMaxBatches is how many full batches' worth of records one
// transaction covers at most while a worker is behind, unless told
// otherwise: an aggregate's events in any of them collapse into one row
// write (see window.go). A transaction also waits for its batches at most
// as long as this many batches could each have waited (BatchMaxWait): 2
// seconds in all by default. On a busy machine fetching a batch takes
// longer than BatchMaxWait, and with fewer batches' worth transactions
// ended on that time, long before their records' bound, writing more rows
// per event.
const DefaultCommitMaxBatches = 40

// DefaultStallAfter is how long a worker with records to apply may go
// without a commit before it counts as stalled unless told otherwise (see
// Config.StallAfter): far longer than any transaction or backoff of a
// healthy member takes.
const DefaultStallAfter = 5 * time.Minute

// minBuffered is the least MaxBuffered defaults to: several fetches of
// small records (a fetch brings up to 256 KiB of a partition), so that a
// worker with small batches does not pause on every fetch. Buffering more
// than a batch did not make the engine faster (it keeps one batch ready
// while the previous one commits) and only cost memory.
const minBuffered = 4000

// Config tunes a worker. Zero fields take the defaults named.
type Config struct {
	// BatchMaxRecords caps the records of one batch (default
	// DefaultBatchMaxRecords).
	BatchMaxRecords int
	// BatchMaxWait is how long a batch waits for more records after its
	// first one (default 50ms).
	BatchMaxWait time.Duration
	// MaxBuffered is how many records may wait in the worker before it
	// pauses fetching of its partition (default BatchMaxRecords, at least
	// minBuffered). It resumes below half of it.
	MaxBuffered int
	// Share, when set, lowers BatchMaxRecords and MaxBuffered each to
	// what it returns, read at every fetch and batch: an engine divides
	// a member-wide bound among the partitions it owns, so that memory
	// does not grow with their number. A transaction of several batches
	// holds the rows of up to twice as many aggregates (see windowFull).
	Share func() int
	// CommitMaxBatches is how many full batches' worth of records one
	// transaction may cover while full batches wait (default
	// DefaultCommitMaxBatches; 1: each batch commits alone).
	CommitMaxBatches int
	// RetryBase and RetryCap bound the exponential backoff with full jitter
	// between attempts of a batch that failed for a transient reason
	// (defaults 100ms and 30s).
	RetryBase, RetryCap time.Duration
	// ClassifyDecode says how to treat a decode error: Terminal errors
	// dead-letter the record at once, Retryable ones after MaxAttempts,
	// Transient ones (the registry is down) retry without limit. Nil:
	// every decode error is terminal.
	ClassifyDecode func(error) Class
	// MaxAttempts is how often an error that may succeed on retry (an
	// unknown schema id, a fold error not marked terminal) is tried before
	// the record is dead-lettered (default 5).
	MaxAttempts int
	// MaxRecordBytes dead-letters records whose value is larger (default
	// 1 MiB, Kafka's default message size).
	MaxRecordBytes int
	// UnreadyAfter is how long a partition may back off before it counts
	// as not ready (default 30s).
	UnreadyAfter time.Duration
	// StallAfter is how long a worker that has records to apply may go
	// without committing before it counts as stalled (default
	// DefaultStallAfter): whatever holds it up, retried failures or a
	// call that never returns, the member is better restarted.
	StallAfter time.Duration
	// Tracer, when set, traces each batch: a "process <topic>" consumer
	// span linked to every record's producer span, with the Postgres
	// commit as a child span. Nil: no tracing.
	Tracer trace.Tracer
}

// Class is how an error is handled.
type Class uint8

const (
	// Transient: infrastructure is unavailable; retry without limit, never
	// dead-letter.
	Transient Class = iota
	// Retryable: may succeed later; retry up to MaxAttempts, then
	// dead-letter.
	Retryable
	// Terminal: retrying cannot help; dead-letter now.
	Terminal
)

func (c *Config) defaults() {
	if c.BatchMaxRecords <= 0 {
		c.BatchMaxRecords = DefaultBatchMaxRecords
	}
	if c.CommitMaxBatches <= 0 {
		c.CommitMaxBatches = DefaultCommitMaxBatches
	}
	if c.BatchMaxWait <= 0 {
		c.BatchMaxWait = 50 * time.Millisecond
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = max(c.BatchMaxRecords, minBuffered)
	}
	if c.RetryBase <= 0 {
		c.RetryBase = 100 * time.Millisecond
	}
	if c.RetryCap <= 0 {
		c.RetryCap = 30 * time.Second
	}
	if c.ClassifyDecode == nil {
		c.ClassifyDecode = func(error) Class { return Terminal }
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = 1 << 20
	}
	if c.UnreadyAfter <= 0 {
		c.UnreadyAfter = 30 * time.Second
	}
	if c.StallAfter <= 0 {
		c.StallAfter = DefaultStallAfter
	}
}

// Worker consumes one topic-partition for one projection: it batches the
// records pushed to it, decodes them, gates versions, and commits each
// batch through the sink. Push is called by the poll loop; Run by the
// goroutine that owns the worker.
type Worker struct {
	cfg    Config
	group  string
	claim  sinks.Claim
	proj   *projection.Projection
	sink   sinks.Sink
	peeker sinks.Peeker // sink, when it reads state outside a batch (nil: it does not)
	dec    Decoder
	values ValuesDecoder // dec, when events are decoded into values (see ValuesDecoder)
	// batchMem is the memory of the batches a window plans, one after
	// the other (see batchMemory).
	batchMem batchMemory
	// keyIndex is the index of a batch's keys that batchKeys builds,
	// cleared and used again by the next batch; only Run's goroutine
	// touches it.
	keyIndex map[string]int
	// pending is the transaction of a window committing while the worker
	// plans the next one (see launch); only Run's goroutine touches it.
	pending *pendingCommit
	fetcher Fetcher
	log     *slog.Logger
	metrics *Metrics

	mu      sync.Mutex
	queue   []*kgo.Record
	paused  bool // the buffer is full
	stopped bool
	// fetchPaused is what the worker last asked of the fetcher; it only
	// changes in syncFetch, with mu held.
	fetchPaused bool
	oldest      time.Time // timestamp of the oldest record not yet committed
	// rewinding drops what is pushed until the fetcher has moved back to
	// replay a window (see replay).
	rewinding bool
	// alone is the end of the last window replayed: the batches before it
	// commit one by one.
	alone   int64
	wake    chan struct{}
	stop    chan struct{}
	stopOne sync.Once
	// draining is set by Drain, before stop closes.
	draining atomic.Bool

	next         atomic.Int64 // stored next offset, after the last commit
	hwm          atomic.Int64 // high watermark last seen in a fetch
	backoffSince atomic.Int64 // unix nanoseconds; 0 when not backing off
	// progress is when the worker last committed, or last stopped
	// waiting for records with none in hand (unix nanoseconds); idle is
	// set while it waits so. A worker neither idle nor making progress
	// for StallAfter is stalled.
	progress atomic.Int64
	idle     atomic.Bool
	// badStatements counts the attempts in a row that failed with
	// ErrBadStatement; refusing is set once they have halted the
	// partition (see refusedBy). Only Run's goroutine touches them.
	badStatements int
	refusing      bool

	gaps     gaps
	repairer Repairer // nil: no repair
	// repairDown is when the repair source was first found unavailable in
	// the current outage (zero: it answers), repairLogged when that was
	// last logged; only Run's goroutine touches them.
	repairDown, repairLogged time.Time
	skips                    chan skipRequest
	halted                   atomic.Pointer[string]
	// keyWarn says, at most once a minute, that records were keyed as
	// another aggregate: a producer that does it does it for many.
	keyWarn rate.Sometimes
}

// NewWorker returns a worker for a claimed partition.
// repairer may be nil; it is used when the projection's gap policy is
// repair.
func NewWorker(cfg Config, group string, claim sinks.Claim, p *projection.Projection, sink sinks.Sink, dec Decoder, repairer Repairer, f Fetcher, log *slog.Logger, m *Metrics) *Worker {
	cfg.defaults()
	w := &Worker{
		cfg: cfg, group: group, claim: claim, proj: p, sink: sink, dec: dec, fetcher: f, metrics: m, repairer: repairer,
		log:   log.With("topic", claim.Topic, "partition", claim.Partition, "epoch", claim.Epoch),
		wake:  make(chan struct{}, 1),
		skips: make(chan skipRequest),
		stop:  make(chan struct{}),
	}
	w.keyWarn.Interval = time.Minute
	w.peeker, _ = sink.(sinks.Peeker)
	if vd, ok := dec.(ValuesDecoder); ok && vd.Width() > 0 && !p.ReadsFieldsMap() {
		w.values = vd
	}
	w.next.Store(claim.NextOffset)
	w.hwm.Store(-1)
	w.progress.Store(time.Now().UnixNano())
	// An earlier worker of the partition may have left its fetching
	// paused (one replaced before it was removed, or one that stopped on
	// an error): the new worker starts with it resumed.
	w.fetchPaused = true
	w.syncFetch()
	return w
}

// settleThen settles the pending transaction (see settle), then runs
// then (nil: nothing), which does not depend on the records after it.
func (w *Worker) settleThen(ctx context.Context, then func() error) error {
	if _, err := w.settle(ctx); err != nil {
		return err
	}
	if then == nil {
		return nil
	}
	return then()
}

// TP is the worker's partition.
func (w *Worker) TP() sinks.TP { return w.claim.TP }

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

// Stop asks the worker to finish its open batch and return from Run.
func (w *Worker) Stop() {
	w.stopOne.Do(func() {
		w.mu.Lock()
		w.stopped = true
		w.mu.Unlock()
		close(w.stop)
	})
}

// Drain is Stop for a member shutting down: the worker takes no new
// batch, and a transaction of batches it has planned that fails for a
// transient reason is tried again until its context ends, where a revoked
// worker abandons it at once (the partition's next owner is waiting for
// it). A batch not planned yet (its records still decoding) is abandoned
// either way.
func (w *Worker) Drain() {
	w.draining.Store(true)
	w.Stop()
}

// Status is the worker's position for lag metrics and readiness.
type Status struct {
	sinks.TP
	NextOffset    int64
	HighWatermark int64 // -1 when not yet known
	Oldest        time.Time
	// BackoffSince is when the current run of failed attempts began; zero
	// when the worker is not backing off.
	BackoffSince time.Time
	// Unready is set when the worker has backed off longer than
	// UnreadyAfter.
	Unready bool
	// Parked counts events waiting for a missing version; OldestParked is
	// when the oldest of them was parked.
	Parked       int
	OldestParked time.Time
	// RepairUnavailable counts the aggregates whose last repair attempt
	// found the repair source unavailable; they are retried with backoff.
	RepairUnavailable int
	// Halted says why the partition stopped, "" while it runs.
	Halted string
	// Stalled is set when the worker, not halted, has had records to
	// apply and committed none for longer than StallAfter, since
	// ProgressAt.
	Stalled    bool
	ProgressAt time.Time
}

// Status reports the worker's committed position.
func (w *Worker) Status() Status {
	w.mu.Lock()
	oldest := w.oldest
	w.mu.Unlock()
	st := Status{TP: w.claim.TP, NextOffset: w.next.Load(), HighWatermark: w.hwm.Load(), Oldest: oldest}
	st.Parked, st.OldestParked, st.RepairUnavailable = w.gaps.totals()
	if h := w.halted.Load(); h != nil {
		st.Halted = *h
	}
	if ns := w.backoffSince.Load(); ns != 0 {
		st.BackoffSince = time.Unix(0, ns)
		st.Unready = time.Since(st.BackoffSince) > w.cfg.UnreadyAfter
	}
	st.ProgressAt = time.Unix(0, w.progress.Load())
	st.Stalled = !w.idle.Load() && st.Halted == "" && time.Since(st.ProgressAt) > w.cfg.StallAfter
	return st
}

// Run processes batches until Stop is called or ctx ends. It returns
// ErrFenced when a newer owner took the partition, ctx.Err() when
// cancelled, and nil after Stop.
func (w *Worker) Run(ctx context.Context) error {
	defer w.leaveRefused()
	var parked map[string]sinks.ParkedInfo
	err := w.retry(ctx, "load parked", func() (err error) {
		parked, err = w.sink.Parked(ctx, w.claim.TP)
		return err
	})
	if errors.Is(err, errStopped) {
		w.done()
		return nil
	}
	if err != nil {
		return err
	}
	w.gaps.mu.Lock()
	w.gaps.aggs = make(map[string]*gap, len(parked))
	for k, info := range parked {
		w.gaps.aggs[k] = &gap{count: info.Count, since: info.Since}
	}
	w.gaps.mu.Unlock()

	var repairs chan repaired
	if w.repairer != nil && w.proj.OnGap == projection.GapRepair {
		repairs = make(chan repaired)
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.repairLoop(rctx, repairs)
		}()
		defer func() {
			cancel()
			wg.Wait()
		}()
	}
	for {
		j, ok := w.nextBatch(ctx, repairs)
		if !ok {
			if _, err := w.settle(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, errStopped) {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}
		switch {
		case j.settle:
			// The transaction committing in the background has returned
			// while the worker waits for records: its offset, metrics and
			// status are brought up to date.
			err = w.settleThen(ctx, nil)
		case j.repair != nil:
			err = w.settleThen(ctx, func() error { return w.applyRepair(ctx, *j.repair) })
		case j.skip != nil:
			err = w.settleThen(ctx, func() error { return w.skip(ctx, *j.skip) })
		case len(j.recs) == 0:
		case w.windowing(len(j.recs)):
			err = w.processWindow(ctx, j.recs)
		default:
			// Fetched after the pending transaction's window: void if it
			// is applied again.
			if ok, serr := w.settle(ctx); serr != nil {
				err = serr
			} else if ok {
				err = w.process(ctx, j.recs)
			}
		}
		if err != nil {
			// Stopped first, so that a pending transaction that failed is
			// not retried: the records are consumed again.
			w.Stop()
			w.settle(ctx) //nolint:errcheck // stopping: the first error is the one to report
			if errors.Is(err, errStopped) {
				w.done()
				return nil // revoked while backing off: the open batch is abandoned
			}
			if errors.Is(err, sinks.ErrFenced) {
				w.metrics.fenced.Inc()
				w.log.Warn("partition fenced: a newer owner claimed it; stopping this worker")
			}
			w.Stop()
			return err
		}
	}
}

// errStopped ends a backoff when the worker is asked to stop.
var errStopped = errors.New("worker stopped")

// nextBatch waits for records and gathers up to BatchMaxRecords of them
// (or the worker's share),
// waiting at most BatchMaxWait after the first. ok is false when the worker
// must stop.
func (w *Worker) nextBatch(ctx context.Context, repairs <-chan repaired) (job, bool) {
	var deadline <-chan time.Time
	for {
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		if batchMax, _ := w.limits(); n >= batchMax {
			break
		}
		var skips <-chan skipRequest
		if n == 0 {
			skips = w.skips // records fetched before the skip go first
			if w.pending == nil {
				w.setIdle(true)
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
		case <-deadline:
			w.setIdle(false)
			return job{recs: w.take()}, true
		}
		w.setIdle(false)
		return j, true
	}
	w.setIdle(false)
	return job{recs: w.take()}, true
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
// effect (see Config.Share).
func (w *Worker) limits() (batchMax, buffered int) {
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

// job is the worker's next piece of work: a batch of records, a repair
// answer, or a skip past records deleted by retention.
type job struct {
	recs   []*kgo.Record
	repair *repaired
	skip   *skipRequest
	settle bool // the pending transaction has returned (see settle)
}

type skipRequest struct {
	to   int64
	done chan error
}

// SkipTo moves the stored offset forward to offset without applying the
// records before it (they were deleted by retention). It runs after the
// records already handed to the worker and returns once committed.
func (w *Worker) SkipTo(ctx context.Context, offset int64) error {
	req := skipRequest{to: offset, done: make(chan error, 1)}
	select {
	case w.skips <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-w.stop:
		return errStopped
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *Worker) skip(ctx context.Context, req skipRequest) error {
	from := w.claim.NextOffset
	if req.to <= from {
		req.done <- nil
		return nil
	}
	err := w.retry(ctx, "skip deleted records", func() error {
		return w.sink.CommitBatch(ctx, w.claim, req.to, sinks.Keys{}, func(sinks.State) (sinks.Changes, error) { return sinks.Changes{}, nil })
	})
	if err == nil {
		w.claim.NextOffset = req.to
		w.next.Store(req.to)
		w.halted.Store(nil)
		w.mu.Lock()
		w.syncFetch()
		w.mu.Unlock()
		w.log.Warn("skipped records deleted by retention before they were applied", "from", from, "to", req.to, "lost", req.to-from)
		w.metrics.skipped.WithLabelValues(w.group, w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Add(float64(req.to - from))
	}
	req.done <- err
	return err
}

// Halt marks the partition as stopped by a condition an operator must
// resolve (records deleted before they were applied); /readyz reports it.
// Fetching of the partition stays paused until SkipTo moves past it: a
// fetch from an offset that is not in the log fails at once, over and
// over.
func (w *Worker) Halt(reason string) {
	w.halted.Store(&reason)
	w.mu.Lock()
	w.syncFetch()
	w.mu.Unlock()
}

// Unhalt resumes a partition halted by Halt whose condition went away on
// its own.
func (w *Worker) Unhalt() {
	w.halted.Store(nil)
	w.mu.Lock()
	w.syncFetch()
	w.mu.Unlock()
}

// retry runs fn until it succeeds, backing off with full jitter between
// attempts, or until ctx ends.
func (w *Worker) retry(ctx context.Context, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			w.done()
			return nil
		}
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil {
			return err
		}
		if err := w.backoff(ctx, attempt, what, err); err != nil {
			return err
		}
	}
}

// backoff waits before the next attempt, with fetching of the partition
// paused so that nothing piles up meanwhile. done ends the run of attempts.
// Stop ends the wait with errStopped.
func (w *Worker) backoff(ctx context.Context, attempt int, what string, cause error) error {
	return w.backoffUnless(ctx, attempt, what, cause, false)
}

// backoffPlanned is backoff before a transaction of planned batches is
// tried again: a worker told to Drain keeps waiting, to try it again.
func (w *Worker) backoffPlanned(ctx context.Context, attempt int, what string, cause error) error {
	return w.backoffUnless(ctx, attempt, what, cause, true)
}

// backoffUnless is backoff, which Stop ends unless planned is set and the
// worker drains.
func (w *Worker) backoffUnless(ctx context.Context, attempt int, what string, cause error, planned bool) error {
	if w.backoffSince.CompareAndSwap(0, time.Now().UnixNano()) {
		w.mu.Lock()
		w.syncFetch()
		w.mu.Unlock()
		w.metrics.backoff.WithLabelValues(w.group, w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Set(1)
	}
	quiet := w.refusedBy(what, cause)
	delay := backoff.Policy{Base: w.cfg.RetryBase, Cap: w.cfg.RetryCap}.Delay(attempt)
	w.metrics.retries.WithLabelValues(w.group, w.claim.Topic, strconv.Itoa(int(w.claim.Partition)), reasonOf(cause)).Inc()
	if quiet {
		delay = w.cfg.RetryCap // halted: said once, tried now and then
	} else {
		w.log.Warn("transient failure; retrying", "what", what, "attempt", attempt+1, "delay", delay, "err", cause)
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	stop := w.stop
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			if !planned || !w.draining.Load() {
				return errStopped // a revocation must not wait out the delay
			}
			stop = nil // draining: tried again until ctx ends
		case <-t.C:
			return nil
		}
	}
}

// done ends a run of failed attempts: fetching resumes unless the buffer
// is full.
func (w *Worker) done() {
	w.accepted()
	if w.backoffSince.Swap(0) == 0 {
		return
	}
	w.metrics.backoff.WithLabelValues(w.group, w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Set(0)
	w.mu.Lock()
	w.syncFetch()
	w.mu.Unlock()
}
