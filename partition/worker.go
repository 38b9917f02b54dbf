package partition

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Worker consumes one topic-partition for every projection of its topic,
// each a lane (see lanes.go): it batches the records pushed to it,
// decodes them, gates versions, and commits each batch through the
// sinks. Push is called by the poll loop; Run by the goroutine that owns
// the worker.
type Worker struct {
	cfg   Config
	group string
	claim sinks.Claim
	// lanes are the projections the partition's topic feeds, the
	// worker's own (WorkerDeps.Projection) first.
	lanes []*lane
	// pending is the transaction of a window committing while the worker
	// plans the next one (see launch); only Run's goroutine touches it.
	pending *pendingCommit
	// shrink is how far transactions are shrunk after one met a limit
	// of Postgres, partMax the most records of a batch then (0: no
	// bound); see shrink.go. Only Run's goroutine touches shrink.
	shrink  shrinking
	partMax atomic.Int64
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

	next         atomic.Int64           // stored next offset, after the last commit
	hwm          atomic.Int64           // high watermark last seen in a fetch
	backoffSince atomic.Int64           // unix nanoseconds; 0 when not backing off
	backoffErr   atomic.Pointer[string] // the last failure retried, while backing off
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
	// storm is the partition's halt when most of its recent records
	// would be dead letters of one class in a lane (see storm.go). Only
	// Run's goroutine touches it.
	storm stormHalt
	// refusal is the record a batch applied alone dead-letters, isolating
	// how deep the halving of a refused batch is (see isolate.go). Only
	// Run's goroutine touches them.
	refusal   *refusal
	isolating int
	now       func() time.Time

	stored   func(end int64) // WorkerDeps.Stored; nil: none
	repairer Repairer        // nil: no repair; repairs fill the gaps of the first lane
	// repairDown is when the repair source was first found unavailable in
	// the current outage (zero: it answers), repairLogged when that was
	// last logged; only Run's goroutine touches them.
	repairDown, repairLogged time.Time
	skips                    chan skipRequest
	halted                   atomic.Pointer[halt]
	// redrives reads the dead letters queued for the partition (nil:
	// none are); redrive is signalled by Redrive when some are.
	redrives     RedriveSource
	redrive      chan struct{}
	redriveState redriveState
}

// WorkerDeps are what a worker works with besides its Config: the
// partition it claimed and the parts of the engine it uses.
type WorkerDeps struct {
	// Group is the consumer group the worker consumes for (a label of
	// its metrics and traces).
	Group string
	// Claim is the partition and the position the worker starts from.
	Claim sinks.Claim
	// Projection is what the partition's records fold into.
	Projection *projection.Projection
	// Sink commits each batch with the partition's next offset.
	Sink sinks.Sink
	// Decoder decodes record values (a ValuesDecoder decodes batches
	// into values).
	Decoder Decoder
	// Repairer fills gaps when the projection's gap policy is repair;
	// nil: no repair.
	Repairer Repairer
	// Fetcher pauses and resumes fetching of the partition; one that is
	// also a Rewinder lets a worker that is behind commit several batches
	// in one transaction.
	Fetcher Fetcher
	// Log receives the worker's log lines (nil: discarded).
	Log *slog.Logger
	// Metrics are shared by an engine's workers (nil: the worker's own,
	// registered nowhere).
	Metrics *Metrics
	// Now is the clock that paces the worker's rate-limited log lines
	// (nil: time.Now).
	Now func() time.Time
	// Others are the other projections the partition's topic feeds: each
	// batch is planned for each of them with its own version gate and
	// parked events, and committed with Projection's in one transaction
	// (Sink must be a sinks.LaneCommitter). A projection with on_gap
	// repair cannot share its topic.
	Others []Lane
	// Stored, when set, is called on the worker's goroutine with the
	// partition's stored next offset each time a transaction moved it
	// (batches, and skips past deleted records). It must return quickly:
	// the partition's next transaction waits for it. Unlike
	// Config.Committed it gathers no keys, so it costs nothing per row.
	Stored func(end int64)
	// Redrives reads the dead letters queued for the partition to apply
	// again (see Worker.Redrive); nil: none are.
	Redrives RedriveSource
}

// NewWorker returns a worker for a claimed partition.
func NewWorker(cfg Config, d WorkerDeps) *Worker {
	cfg.defaults()
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics(prometheus.NewRegistry(), nil)
	}
	claim := d.Claim
	w := &Worker{
		cfg: cfg, group: d.Group, claim: claim, fetcher: d.Fetcher, metrics: d.Metrics, repairer: d.Repairer, stored: d.Stored,
		log:      d.Log.With("topic", claim.Topic, "partition", claim.Partition, "epoch", claim.Epoch),
		wake:     make(chan struct{}, 1),
		skips:    make(chan skipRequest),
		redrives: d.Redrives,
		redrive:  make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	w.now = d.Now
	if w.now == nil {
		w.now = time.Now
	}
	w.metrics.knownPartition(claim.TP)
	w.next.Store(claim.NextOffset)
	w.hwm.Store(-1)
	w.progress.Store(time.Now().UnixNano())
	w.lanes = make([]*lane, 0, 1+len(d.Others))
	w.newLane(d.Projection, d.Sink, d.Decoder, w.log)
	for _, o := range d.Others {
		w.newLane(o.Projection, o.Sink, o.Decoder, w.log.With("projection", o.Projection.Name))
	}
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
	// Projection is the projection the partition feeds; Others are the
	// other projections of its topic, with their parked events and
	// counts (the other fields but the partition's own are
	// Projection's).
	Projection string
	Others     []LaneStatus
	// Applied, Stale and DeadLettered count the records the worker's
	// committed transactions applied, ignored as duplicates or older
	// versions, and dead-lettered, since the worker started.
	Applied, Stale, DeadLettered int64
	NextOffset                   int64
	HighWatermark                int64 // -1 when not yet known
	Oldest                       time.Time
	// BackoffSince is when the current run of failed attempts began; zero
	// when the worker is not backing off.
	BackoffSince time.Time
	// Unready is set when the worker has backed off longer than
	// UnreadyAfter.
	Unready bool
	// BackoffErr is the last failure retried while backing off (quoting
	// at most a few hundred bytes of data).
	BackoffErr string
	// Parked counts events waiting for a missing version; OldestParked is
	// when the oldest of them was parked.
	Parked       int
	OldestParked time.Time
	// RepairUnavailable counts the aggregates whose last repair attempt
	// found the repair source unavailable; they are retried with backoff.
	RepairUnavailable int
	// Halted says why the partition stopped, "" while it runs; HaltKind
	// names the halt (one of the sinks.Halt… values) and HaltedSince
	// says when it began.
	Halted      string
	HaltKind    string
	HaltedSince time.Time
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
	own := w.lanes[0]
	st := Status{TP: w.claim.TP, Projection: own.proj.Name, NextOffset: w.next.Load(), HighWatermark: w.hwm.Load(), Oldest: oldest,
		Applied: own.totals.applied.Load(), Stale: own.totals.stale.Load(), DeadLettered: own.totals.dead.Load()}
	st.Parked, st.OldestParked, st.RepairUnavailable = own.gaps.totals()
	for _, o := range w.lanes[1:] {
		var ls LaneStatus
		ls.Projection = o.proj.Name
		ls.Parked, ls.OldestParked, _ = o.gaps.totals()
		ls.Applied, ls.Stale, ls.DeadLettered = o.totals.applied.Load(), o.totals.stale.Load(), o.totals.dead.Load()
		st.Others = append(st.Others, ls)
	}
	if h := w.halted.Load(); h != nil {
		st.Halted, st.HaltKind, st.HaltedSince = h.reason, h.kind, h.since
	}
	if ns := w.backoffSince.Load(); ns != 0 {
		st.BackoffSince = time.Unix(0, ns)
		st.Unready = time.Since(st.BackoffSince) > w.cfg.UnreadyAfter
		if e := w.backoffErr.Load(); e != nil {
			st.BackoffErr = *e
		}
	}
	st.ProgressAt = time.Unix(0, w.progress.Load())
	st.Stalled = !w.idle.Load() && st.Halted == "" && time.Since(st.ProgressAt) > w.cfg.StallAfter
	return st
}

// Run processes batches until Stop is called or ctx ends. It returns
// ErrFenced when a newer owner took the partition, ctx.Err() when
// cancelled, and nil after Stop.
func (w *Worker) Run(ctx context.Context) error {
	defer w.leaveStorm()
	defer w.leaveRefused()
	if err := w.lanesCommit(); err != nil {
		return err
	}
	for _, l := range w.lanes {
		var parked map[string]sinks.ParkedInfo
		err := w.retry(ctx, "load parked", func() (err error) {
			parked, err = l.sink.Parked(ctx, w.claim.TP)
			return err
		})
		if errors.Is(err, errStopped) {
			w.done()
			return nil
		}
		if err != nil {
			return err
		}
		l.gaps.mu.Lock()
		l.gaps.aggs = make(map[string]*gap, len(parked))
		for k, info := range parked {
			l.gaps.aggs[k] = &gap{count: info.Count, since: info.Since}
		}
		l.gaps.mu.Unlock()
	}

	var err error
	var repairs chan repaired
	if w.repairer != nil && w.lanes[0].proj.OnGap == projection.GapRepair {
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
		case j.redrive:
			err = w.settleThen(ctx, func() error { return w.applyRedrives(ctx) })
		case len(j.recs) == 0:
		case w.windowing(len(j.recs)):
			err = w.processWindow(ctx, j.recs)
		default:
			// Fetched after the pending transaction's window: void if it
			// is applied again.
			if ok, serr := w.settle(ctx); serr != nil {
				err = serr
			} else if ok {
				err = w.processParts(ctx, j.recs)
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

// job is the worker's next piece of work: a batch of records, a repair
// answer, or a skip past records deleted by retention.
type job struct {
	recs   []*kgo.Record
	repair *repaired
	skip   *skipRequest
	settle bool // the pending transaction has returned (see settle)
	// redrive: dead letters are queued for the partition (see Redrive).
	redrive bool
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
		// The offset is the partition's, which the first lane's sink
		// stores for every lane.
		return w.lanes[0].sink.CommitBatch(ctx, w.claim, req.to, sinks.Keys{}, func(sinks.State) (sinks.Changes, error) { return sinks.Changes{}, nil })
	})
	if err == nil {
		w.claim.NextOffset = req.to
		w.next.Store(req.to)
		w.notifyCommitted(req.to, 0, nil)
		w.halted.Store(nil)
		w.mu.Lock()
		w.syncFetch()
		w.mu.Unlock()
		w.log.Warn("skipped records deleted by retention before they were applied", "from", from, "to", req.to, "lost", req.to-from)
		w.metrics.skipped.WithLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Add(float64(req.to - from))
	}
	req.done <- err
	return err
}

// halt is why a partition stopped: kind is one of the sinks.Halt…
// values, since when the halt of that kind began.
type halt struct {
	kind, reason string
	since        time.Time
}

// Halt marks the partition as stopped by a condition an operator must
// resolve (records deleted before they were applied), of kind (one of the
// sinks.Halt… values); /readyz reports it. Fetching of the partition stays
// paused until SkipTo moves past it: a fetch from an offset that is not in
// the log fails at once, over and over. Halted again while halted (the
// reason said anew, or found to be another), the halt keeps the time it
// began: the partition has not moved since.
func (w *Worker) Halt(kind, reason string) {
	h := &halt{kind: kind, reason: reason, since: w.now()}
	if old := w.halted.Load(); old != nil {
		h.since = old.since
	}
	w.halted.Store(h)
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
