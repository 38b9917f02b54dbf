package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/repair"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// What to do when retention deleted records before they were applied.
const (
	OffsetLostHalt = "halt"
	OffsetLostSkip = "skip"
)

// DefaultMemberMaxRecords is the most records a member holds unless told
// otherwise (see Config.MemberMaxRecords): a share of 5000 records for
// the batch and as many for the buffer of each of up to 12 partitions, in
// which default batches of 2000 and a buffer of 4000 fit (about 50 MB of
// live heap with 200-byte events: a decoded event in a batch takes about
// 1 KB, a buffered record about 0.5 KB). A member with 48 partitions
// batches and buffers 1250 records each instead of growing to four times
// that.
const DefaultMemberMaxRecords = 120_000

// Start positions for partitions without a stored offset.
const (
	StartEarliest = "earliest"
	StartLatest   = "latest"
)

// Config configures an Engine. Validate names the field at fault.
type Config struct {
	// Brokers are the Kafka seed brokers.
	Brokers []string
	// Identity is the consumer identity: the Kafka group id and the
	// namespace of stored offsets and parked events.
	Identity string
	// Projections to run; each one's topic is consumed.
	Projections []*projection.Projection
	// StartFrom is where a partition without a stored offset starts:
	// "earliest" (default) or "latest".
	StartFrom string
	// Partition tunes the partition workers (batch size and wait, buffer,
	// retry backoff).
	Partition partition.Config
	// StateCacheRows is how many aggregates' rows each projection keeps in
	// memory, so that a batch reads from Postgres only the aggregates it
	// has not seen recently (0: postgres.DefaultStateCacheRows; negative:
	// no cache, every batch reads its aggregates). projector must be the
	// only writer of its tables: a row changed behind its back is noticed
	// (the batch is retried from Postgres) only when its version moved or
	// it was deleted.
	StateCacheRows int
	// MemberMaxRecords bounds the records this member holds across the
	// partitions it owns, fetched and waiting or in a batch being
	// applied: each partition's worker gets an equal share for its batch
	// and as much for its buffer, so that memory does not grow with the
	// number of partitions, and a transaction of several batches holds
	// the rows of at most as many aggregates as both shares together (a
	// worker holds two while one commits and the next is planned)
	// (0: DefaultMemberMaxRecords; negative: no
	// bound beyond each worker's BatchMaxRecords and MaxBuffered). The
	// engine sets Partition.Share to apply it.
	MemberMaxRecords int
	// StateCacheBytes bounds the same cache by memory, whichever bound it
	// reaches first (0: postgres.DefaultStateCacheBytes; negative: no
	// cache). It counts each aggregate's key and encoded row and a fixed
	// amount of bookkeeping.
	StateCacheBytes int64
	// RevokeTimeout bounds how long a revoked partition's worker may take
	// to finish its open batch before it is abandoned (default 10s).
	RevokeTimeout time.Duration
	// SessionTimeout is how long the group waits for a silent member
	// before it reassigns its partitions (Kafka's session.timeout.ms,
	// default 45s). A crashed member's partitions resume after it.
	SessionTimeout time.Duration
	// InstanceID makes this member static (Kafka's group.instance.id): a
	// restart within SessionTimeout gets its partitions back without a
	// rebalance. Empty (default): dynamic membership.
	InstanceID string
	// DLQTopic, when set, is the Kafka topic dead letters are also
	// published to (from an outbox written in the batch's transaction).
	DLQTopic string
	// OnOffsetLost is what happens when retention deleted records beyond a
	// partition's stored offset before they were applied: "halt" (default:
	// the partition stops, says so in the log, in
	// projector_partition_halted and in /readyz) or "skip" (continue from
	// the log start; the skipped offsets are counted).
	OnOffsetLost string
	// Repairers gives projections with on_gap repair their repair source,
	// by projection name. A projection missing here gets one built from
	// its Repair spec (HTTP or SQL).
	Repairers map[string]partition.Repairer
	// TracerProvider, when set, traces each batch (see partition.Config
	// Tracer). Nil: no tracing.
	TracerProvider trace.TracerProvider
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the engine's metrics (default: a private
	// registry, i.e. not exported).
	Registerer prometheus.Registerer
	// ClientOpts are extra franz-go options (TLS, SASL, timeouts).
	ClientOpts []kgo.Opt
}

// fetchMaxWait bounds how long the broker holds a fetch with no new data.
const fetchMaxWait = 100 * time.Millisecond

// fetchMaxPartitionBytes bounds one fetch's data for one partition (a
// record batch larger than that still comes whole).
const fetchMaxPartitionBytes = 256 << 10

func (c *Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("config: Brokers: at least one seed broker is required")
	}
	if c.Identity == "" {
		return errors.New("config: Identity: the consumer identity is required")
	}
	if len(c.Projections) == 0 {
		return errors.New("config: Projections: at least one projection is required")
	}
	topics := map[string]bool{}
	for _, p := range c.Projections {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("config: Projections: %w", err)
		}
		if topics[p.Topic] {
			return fmt.Errorf("config: Projections: topic %q feeds two projections", p.Topic)
		}
		topics[p.Topic] = true
	}
	switch c.StartFrom {
	case "":
		c.StartFrom = StartEarliest
	case StartEarliest, StartLatest:
	default:
		return fmt.Errorf("config: StartFrom: %q, want earliest or latest", c.StartFrom)
	}
	switch c.OnOffsetLost {
	case "":
		c.OnOffsetLost = OffsetLostHalt
	case OffsetLostHalt, OffsetLostSkip:
	default:
		return fmt.Errorf("config: OnOffsetLost: %q, want halt or skip", c.OnOffsetLost)
	}
	if c.RevokeTimeout <= 0 {
		c.RevokeTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// Decoders gives the decoder of each projection (by projection name).
type Decoders func(p *projection.Projection) partition.Decoder

// A *schemas.Decoder with a reader schema decodes events into values.
var _ partition.ValuesDecoder = (*schemas.Decoder)(nil)

// Engine runs the projections of one consumer identity as one member of
// its consumer group: one worker goroutine per assigned partition.
type Engine struct {
	cfg       Config
	pool      *pgxpool.Pool
	offsets   *postgres.Offsets
	byTopic   map[string]*projection.Projection
	sinks     map[string]partition.Sink
	decoders  map[string]partition.Decoder
	repairers map[string]partition.Repairer
	closers   []func()
	metrics   *partition.Metrics
	group     *groupMetrics
	log       *slog.Logger

	cl  *kgo.Client
	adm *kadm.Client
	// clientReady is closed once cl and adm are set: the group may call
	// back before kgo.NewClient has returned.
	clientReady chan struct{}

	runCtx context.Context
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[partition.TP]*running
	owned   atomic.Int64 // len(workers), for the workers' shares

	// rewinds holds the workers' requests to fetch their partition again
	// from an earlier offset, served in the poll loop (under mu);
	// stopPoll ends the poll in progress so that they need not wait for
	// records.
	rewinds  []rewind
	stopPoll atomic.Pointer[context.CancelFunc]
}

type rewind struct {
	f      *fetcher
	offset int64
	done   func()
}

// fetcher is what a worker moves its partition's fetching with: pausing
// and resuming through the client, rewinding through the poll loop.
type fetcher struct {
	e  *Engine
	tp partition.TP
	w  *partition.Worker // set once the worker is built
}

func (f *fetcher) PauseFetchPartitions(tps map[string][]int32) map[string][]int32 {
	return f.e.cl.PauseFetchPartitions(tps)
}

func (f *fetcher) ResumeFetchPartitions(tps map[string][]int32) { f.e.cl.ResumeFetchPartitions(tps) }

// Rewind implements partition.Rewinder.
func (f *fetcher) Rewind(_ partition.TP, offset int64, done func()) {
	f.e.mu.Lock()
	f.e.rewinds = append(f.e.rewinds, rewind{f: f, offset: offset, done: done})
	f.e.mu.Unlock()
	if stop := f.e.stopPoll.Load(); stop != nil {
		(*stop)()
	}
}

// rewound serves the rewinds asked for, between polls (no rebalance can
// run until AllowRebalance): the client fetches those partitions again
// from the offsets asked and drops what it had buffered of them. A worker
// no longer running its partition (revoked, perhaps assigned again to a
// new one) moves nothing.
func (e *Engine) rewound() {
	e.mu.Lock()
	var move []rewind
	for _, r := range e.rewinds {
		if cur := e.workers[r.f.tp]; cur != nil && cur.w == r.f.w {
			move = append(move, r)
		} else {
			r.done()
		}
	}
	clear(e.rewinds)
	e.rewinds = e.rewinds[:0]
	e.mu.Unlock()
	for _, r := range move {
		e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{r.f.tp.Topic: {r.f.tp.Partition: {Epoch: -1, Offset: r.offset}}})
		r.done()
	}
}

type running struct {
	w      *partition.Worker
	cancel context.CancelFunc
	done   chan struct{}
}

// New builds an engine. It does not connect until Run.
func New(cfg Config, pool *pgxpool.Pool, decoderOf Decoders) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:         cfg,
		pool:        pool,
		offsets:     postgres.NewOffsets(pool, cfg.Identity),
		byTopic:     map[string]*projection.Projection{},
		sinks:       map[string]partition.Sink{},
		decoders:    map[string]partition.Decoder{},
		repairers:   map[string]partition.Repairer{},
		log:         cfg.Logger.With("group", cfg.Identity),
		workers:     map[partition.TP]*running{},
		clientReady: make(chan struct{}),
	}
	if budget := cfg.MemberMaxRecords; budget >= 0 {
		if budget == 0 {
			budget = DefaultMemberMaxRecords
		}
		// Half for the batches being applied, half for the buffers.
		e.cfg.Partition.Share = func() int { return budget / 2 / int(max(e.owned.Load(), 1)) }
	}
	var topics []string
	for _, p := range cfg.Projections {
		e.byTopic[p.Topic] = p
		sink := postgres.NewSink(pool, cfg.Identity, p, cfg.DLQTopic)
		if cfg.StateCacheRows != 0 || cfg.StateCacheBytes != 0 {
			rows, bytes := cfg.StateCacheRows, cfg.StateCacheBytes
			if rows == 0 {
				rows = postgres.DefaultStateCacheRows
			}
			if bytes == 0 {
				bytes = postgres.DefaultStateCacheBytes
			}
			sink.SetStateCache(max(0, rows), max(0, bytes))
		}
		e.sinks[p.Topic] = sink
		e.decoders[p.Topic] = decoderOf(p)
		topics = append(topics, p.Topic)
		if p.OnGap != projection.GapRepair {
			continue
		}
		r, err := e.repairerOf(p)
		if err != nil {
			e.close()
			return nil, err
		}
		e.repairers[p.Topic] = r
	}
	if cfg.TracerProvider != nil {
		e.cfg.Partition.Tracer = cfg.TracerProvider.Tracer("github.com/projector-dev/projector")
	}
	e.metrics = partition.NewMetrics(cfg.Registerer)
	e.group = newGroupMetrics(cfg.Registerer, cfg.Identity)
	e.group.stalled = newStalledGauge(cfg.Registerer, cfg.Identity)
	cfg.Registerer.MustRegister(&lagCollector{e: e})

	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Identity),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers come through so the stored offset can move
		// past them: otherwise a partition ending in a marker would show
		// lag forever.
		kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		// A worker pauses its partition while its buffer is full. When it
		// resumes, the partition waits for the fetch in flight, which the
		// broker holds up to this long when the other partitions are at
		// their log end: a partition far behind the others (one holding
		// hot aggregates) spent most of its time waiting. franz-go's 5s
		// default left caught-up members idle for seconds at a time;
		// with the Java consumer's 500ms a benchmark stream with hot
		// aggregates went at half the speed it goes with 100ms. A member
		// with nothing to fetch sends ten fetches a second per broker.
		kgo.FetchMaxWait(fetchMaxWait),
		// A partition paused with a fetch in flight has that fetch's data
		// dropped and fetched again after it resumes. With franz-go's 1 MiB
		// per partition a single fetch outgrew a worker's buffer, so nearly
		// every fetch of a busy partition ended in a pause: 2.6 million
		// records fetched and decompressed to consume 1 million. 256 KiB
		// keeps a fetch well inside the buffer (ClientOpts can override).
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
		kgo.OnPartitionsAssigned(e.assigned),
		kgo.OnPartitionsRevoked(e.revoked),
		kgo.OnPartitionsLost(e.lost),
		kgo.AdjustFetchOffsetsFn(e.claim),
		kgo.WithHooks(kprom.NewMetrics("kgo", kprom.Registerer(cfg.Registerer))),
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	opts = append(opts, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	e.cl = cl
	e.adm = kadm.NewClient(cl)
	close(e.clientReady)
	return e, nil
}

// Run consumes until ctx ends, then stops every worker (each finishes its
// open batch), leaves the group and returns.
func (e *Engine) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.mu.Lock()
	e.runCtx = runCtx
	e.mu.Unlock()
	defer func() {
		e.stopAll()
		// A poll may have returned records without letting the group
		// rebalance; leaving the group needs that.
		e.cl.AllowRebalance()
		e.cl.Close()
		e.wg.Wait()
		e.close()
	}()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.watchStalls(runCtx)
	}()
	if e.cfg.DLQTopic != "" {
		pub := dlqpublish.New(e.pool, e.cl, e.log, time.Second)
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			_ = pub.Run(runCtx) // returns when runCtx ends; failed rounds are logged and retried
		}()
	}
	for {
		pollCtx, stop := context.WithCancel(runCtx)
		e.stopPoll.Store(&stop)
		e.mu.Lock()
		if len(e.rewinds) > 0 {
			stop() // asked for before stopPoll was stored
		}
		e.mu.Unlock()
		fetches := e.cl.PollRecords(pollCtx, 10_000)
		stop()
		if fetches.IsClientClosed() || runCtx.Err() != nil {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case errors.Is(err, kerr.OffsetOutOfRange):
				e.offsetLost(runCtx, partition.TP{Topic: topic, Partition: p})
			default:
				e.log.Error("fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		e.mu.Lock()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if r := e.workers[partition.TP{Topic: fp.Topic, Partition: fp.Partition}]; r != nil {
				r.w.Push(fp.Records, fp.HighWatermark)
			}
		})
		e.mu.Unlock()
		e.rewound()
		e.cl.AllowRebalance()
	}
}

func (e *Engine) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	<-e.clientReady
	e.group.assignedNow(assigned)
	e.log.Info("partitions assigned", "partitions", assigned)
}

func (e *Engine) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	<-e.clientReady
	e.group.removed(revoked)
	e.group.revoked.Add(float64(count(revoked)))
	e.log.Info("partitions revoked", "partitions", revoked)
	e.stop(revoked)
}

func (e *Engine) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-e.clientReady
	e.group.removed(lost)
	e.group.lost.Add(float64(count(lost)))
	e.log.Warn("partitions lost", "partitions", lost)
	e.stop(lost)
}

// claim runs after assignment, before fetching starts: it claims the newly
// assigned partitions in Postgres (bumping their owner epochs), starts a
// worker for each, and tells the client to fetch from the stored offsets.
// Kafka's committed offsets are ignored.
func (e *Engine) claim(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-e.clientReady:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var tps []partition.TP
	for t, ps := range offsets {
		for p := range ps {
			tps = append(tps, partition.TP{Topic: t, Partition: p})
		}
	}
	if len(tps) == 0 {
		return offsets, nil
	}
	var claims []postgres.Claimed
	err := retry(ctx, e.log, "claim partitions", func() (err error) {
		claims, err = e.offsets.Claim(ctx, tps)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]map[int32]kgo.Offset, len(offsets))
	for _, c := range claims {
		next, err := e.firstOffset(ctx, c)
		if errors.Is(err, partition.ErrFenced) {
			e.log.Warn("partition claimed by a newer owner before it started", "topic", c.Topic, "partition", c.Partition)
			continue
		}
		if err != nil {
			return nil, err
		}
		if out[c.Topic] == nil {
			out[c.Topic] = map[int32]kgo.Offset{}
		}
		out[c.Topic][c.Partition] = kgo.NewOffset().At(next).WithEpoch(-1)
		e.start(partition.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: next, Since: c.At})
	}
	return out, nil
}

// firstOffset returns the stored next offset, resolving and storing the
// start position for a partition that has none.
func (e *Engine) firstOffset(ctx context.Context, c postgres.Claimed) (int64, error) {
	if c.NextOffset != nil {
		return *c.NextOffset, nil
	}
	var next int64
	err := retry(ctx, e.log, "resolve start offset", func() error {
		list := e.adm.ListStartOffsets
		if e.cfg.StartFrom == StartLatest {
			list = e.adm.ListEndOffsets
		}
		res, err := list(ctx, c.Topic)
		if err != nil {
			return err
		}
		o, ok := res.Lookup(c.Topic, c.Partition)
		if !ok {
			return fmt.Errorf("no offset listed for %s/%d", c.Topic, c.Partition)
		}
		if o.Err != nil {
			return o.Err
		}
		next = o.Offset
		return e.offsets.Init(ctx, c, next)
	})
	return next, err
}

func (e *Engine) start(c partition.Claim) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old := e.workers[c.TP]; old != nil {
		// Reassigned before the old worker was removed: it is fenced by the
		// new epoch anyway; stop it without waiting under the lock.
		old.w.Stop()
		old.cancel()
	}
	p := e.byTopic[c.Topic]
	f := &fetcher{e: e, tp: c.TP}
	w := partition.NewWorker(e.cfg.Partition, e.cfg.Identity, c, p, e.sinks[c.Topic], e.decoders[c.Topic], e.repairers[c.Topic], f, e.log, e.metrics)
	f.w = w
	parent := e.runCtx
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	r := &running{w: w, cancel: cancel, done: make(chan struct{})}
	e.workers[c.TP] = r
	e.owned.Store(int64(len(e.workers)))
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(r.done)
		defer cancel()
		err := w.Run(ctx)
		if err != nil && ctx.Err() == nil {
			e.log.Error("partition worker stopped", "topic", c.Topic, "partition", c.Partition, "err", err)
			e.mu.Lock()
			if e.workers[c.TP] == r {
				delete(e.workers, c.TP)
				e.owned.Store(int64(len(e.workers)))
			}
			e.mu.Unlock()
			e.cl.PauseFetchPartitions(map[string][]int32{c.Topic: {c.Partition}})
		}
	}()
}

// stop stops the workers of the given partitions and waits for them, each
// finishing its open batch within RevokeTimeout or being abandoned.
func (e *Engine) stop(tps map[string][]int32) {
	var stopping []*running
	e.mu.Lock()
	for t, ps := range tps {
		for _, p := range ps {
			tp := partition.TP{Topic: t, Partition: p}
			if r := e.workers[tp]; r != nil {
				delete(e.workers, tp)
				e.owned.Store(int64(len(e.workers)))
				r.w.Stop()
				stopping = append(stopping, r)
			}
		}
	}
	e.mu.Unlock()
	e.cl.ResumeFetchPartitions(tps)
	e.wait(stopping)
	for t, ps := range tps {
		if f, ok := e.sinks[t].(interface{ Forget(partition.TP) }); ok {
			for _, p := range ps {
				f.Forget(partition.TP{Topic: t, Partition: p})
			}
		}
	}
}

func (e *Engine) stopAll() {
	e.mu.Lock()
	stopping := make([]*running, 0, len(e.workers))
	for tp, r := range e.workers {
		delete(e.workers, tp)
		e.owned.Store(int64(len(e.workers)))
		r.w.Stop()
		stopping = append(stopping, r)
	}
	e.mu.Unlock()
	e.wait(stopping)
}

func (e *Engine) wait(stopping []*running) {
	abandon := time.AfterFunc(e.cfg.RevokeTimeout, func() {
		for _, r := range stopping {
			r.cancel()
		}
	})
	defer abandon.Stop()
	for _, r := range stopping {
		<-r.done
	}
}

// offsetLost handles a partition whose stored offset is no longer in the
// log: retention deleted records before they were applied. It runs in the
// poll loop, where moving the fetch position is safe.
func (e *Engine) offsetLost(ctx context.Context, tp partition.TP) {
	e.mu.Lock()
	r := e.workers[tp]
	e.mu.Unlock()
	if r == nil {
		return
	}
	st := r.w.Status()
	var logStart int64 = -1
	if res, err := e.adm.ListStartOffsets(ctx, tp.Topic); err == nil {
		if o, ok := res.Lookup(tp.Topic, tp.Partition); ok && o.Err == nil {
			logStart = o.Offset
		}
	}
	if e.cfg.OnOffsetLost == OffsetLostSkip && logStart > st.NextOffset {
		if err := r.w.SkipTo(ctx, logStart); err != nil {
			e.log.Error("skipping deleted records failed", "topic", tp.Topic, "partition", tp.Partition, "err", err)
			return
		}
		e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: logStart}}})
		e.group.halted.WithLabelValues(tp.Topic, strconv.Itoa(int(tp.Partition))).Set(0)
		return
	}
	reason := fmt.Sprintf("records from offset %d were deleted (log starts at %d) before they were applied; "+
		"the partition is halted: restore them, or run with --on-offset-lost=skip to continue from the log start and lose them",
		st.NextOffset, logStart)
	r.w.Halt(reason)
	e.group.halted.WithLabelValues(tp.Topic, strconv.Itoa(int(tp.Partition))).Set(1)
	e.log.Error("partition halted: stored offset is no longer in the log", "topic", tp.Topic, "partition", tp.Partition,
		"stored_offset", st.NextOffset, "log_start", logStart, "reason", reason)
}

// Workers returns the status of every running partition worker.
func (e *Engine) Workers() []partition.Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]partition.Status, 0, len(e.workers))
	for _, r := range e.workers {
		out = append(out, r.w.Status())
	}
	return out
}

// Ready reports whether the engine has joined its group and Postgres
// answers, with one entry per check.
func (e *Engine) Ready(ctx context.Context) map[string]error {
	checks := map[string]error{}
	if _, gen := e.cl.GroupMetadata(); gen < 0 {
		checks["group"] = errors.New("not joined to the consumer group yet")
	} else {
		checks["group"] = nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	checks["postgres"] = e.pool.Ping(ctx)
	var stuck []string
	for _, s := range e.Workers() {
		if s.Unready {
			stuck = append(stuck, fmt.Sprintf("%s/%d backing off since %s", s.Topic, s.Partition, s.BackoffSince.UTC().Format(time.RFC3339)))
		}
		if s.Halted != "" {
			stuck = append(stuck, fmt.Sprintf("%s/%d halted: %s", s.Topic, s.Partition, s.Halted))
		}
	}
	checks["partitions"] = nil
	if len(stuck) > 0 {
		slices.Sort(stuck)
		checks["partitions"] = errors.New(strings.Join(stuck, "; "))
	}
	return checks
}

// Client is the engine's Kafka client (for admin calls; do not poll it).
func (e *Engine) Client() *kgo.Client { return e.cl }

// retry runs fn with exponential backoff and full jitter until it
// succeeds or ctx ends.
func retry(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	const base, ceiling = 100 * time.Millisecond, 10 * time.Second
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || errors.Is(err, partition.ErrFenced) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		limit := ceiling
		if attempt < 20 {
			limit = min(ceiling, base<<attempt)
		}
		delay := time.Duration(rand.Int64N(int64(limit) + 1))
		log.Warn("transient failure; retrying", "what", what, "attempt", attempt+1, "delay", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(delay):
		}
	}
}

func count(m map[string][]int32) int {
	n := 0
	for _, ps := range m {
		n += len(ps)
	}
	return n
}

// ClassifyDecode tells the partition workers how to treat a decode error
// of package schemas: malformed or undecodable values and schemas the
// projection cannot read are terminal, an unknown schema id is retried up
// to the attempt limit (it may be registered late), anything else (the
// registry unreachable) is transient.
func ClassifyDecode(err error) partition.Class {
	switch {
	case errors.Is(err, schemas.ErrUnknownSchema):
		return partition.Retryable
	case schemas.IsTerminal(err):
		return partition.Terminal
	}
	return partition.Transient
}

// repairerOf returns the repair source of a projection with on_gap repair.
func (e *Engine) repairerOf(p *projection.Projection) (partition.Repairer, error) {
	if r := e.cfg.Repairers[p.Name]; r != nil {
		return r, nil
	}
	spec := p.Repair
	switch {
	case spec == nil:
		return nil, fmt.Errorf("projection %q: on_gap repair needs a repair source (Config.Repairers or the projection's repair:)", p.Name)
	case spec.HTTPURL != "":
		r, err := repair.NewHTTP(repair.HTTPConfig{URL: spec.HTTPURL, Timeout: spec.HTTPTimeout}, nil)
		if err != nil {
			return nil, fmt.Errorf("projection %q: repair.http: %w", p.Name, err)
		}
		return r, nil
	}
	pool, err := pgxpool.New(context.Background(), spec.SQLDatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("projection %q: repair.sql.database_url: %w", p.Name, err)
	}
	e.closers = append(e.closers, pool.Close)
	r, err := repair.NewSQL(pool, repair.SQLConfig{Query: spec.SQLQuery})
	if err != nil {
		return nil, fmt.Errorf("projection %q: repair.sql: %w", p.Name, err)
	}
	return r, nil
}

func (e *Engine) close() {
	for _, c := range e.closers {
		c()
	}
	e.closers = nil
}
