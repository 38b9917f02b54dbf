package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/repair"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
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
	// Store makes each projection's sink and the identity's offset store
	// (postgres.NewStore for Postgres). Required.
	Store Store
	// StartFrom is where a partition without a stored offset starts:
	// "earliest" (default) or "latest".
	StartFrom string
	// Partition tunes the partition workers (batch size and wait, buffer,
	// retry backoff, the dead-letter storm guard); its RetryBase and RetryCap also pace the engine's
	// retries of claims and start offsets. A nil ClassifyDecode is the
	// engine's own, ClassifyDecode.
	Partition partition.Config
	// StateCacheRows is how many aggregates' rows each projection keeps in
	// memory, so that a batch reads from Postgres only the aggregates it
	// has not seen recently (0: the sink's default; negative:
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
	// reaches first (0: the sink's default; negative: no
	// cache). It counts each aggregate's key and encoded row and a fixed
	// amount of bookkeeping, and a fixed amount per partition.
	StateCacheBytes int64
	// RevokeTimeout bounds how long a revoked partition's worker may take
	// to finish its open batch before it is abandoned (default 10s).
	RevokeTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context ends, waits
	// for the workers to commit the batches they have planned before it
	// abandons them and leaves the group (default
	// DefaultShutdownTimeout). Keep it below the time the process is given
	// to exit (Kubernetes' terminationGracePeriodSeconds, 30s by default).
	ShutdownTimeout time.Duration
	// GroupProtocol is the consumer group protocol (Kafka's
	// group.protocol): "classic" (default), where the members assign the
	// partitions among themselves with the cooperative-sticky balancer,
	// or "consumer" (KIP-848, Kafka 4.0 or later), where the brokers'
	// group coordinator assigns them (its uniform assignor) and hands
	// them over incrementally on the members' heartbeats. Under
	// "consumer" the session timeout and heartbeat interval are the
	// brokers' (group.consumer.session.timeout.ms, default 45s, and
	// group.consumer.heartbeat.interval.ms, or the group's
	// consumer.session.timeout.ms), so SessionTimeout does not apply.
	// Brokers that do not offer it, or have it turned off, are joined
	// with the classic protocol, which the engine warns about once.
	GroupProtocol string
	// SessionTimeout is how long the group waits for a silent member
	// before it reassigns its partitions (Kafka's session.timeout.ms;
	// 0: 45s), under the classic group protocol only. A crashed
	// member's partitions resume after it.
	SessionTimeout time.Duration
	// InstanceID makes this member static (Kafka's group.instance.id),
	// under either group protocol: a restart within the session timeout
	// gets its partitions back without a rebalance. Empty (default):
	// dynamic membership.
	InstanceID string
	// DLQTopic, when set, is the Kafka topic dead letters are also
	// published to (from an outbox written in the batch's transaction).
	DLQTopic string
	// OnOffsetLost is what happens when retention deleted records beyond a
	// partition's stored offset before they were applied: "halt" (default:
	// the partition stops fetching and says so once in the log, in
	// projector_partition_halted and in /readyz) or "skip" (continue from
	// the log start; the skipped offsets are counted). A stored offset
	// past the log end (the topic was created again) always halts.
	OnOffsetLost string
	// Repairers gives projections with on_gap repair their repair source,
	// by projection name. A projection missing here gets one built from
	// its Repair spec (HTTP or SQL).
	Repairers map[string]partition.Repairer
	// TracerProvider, when set, traces each batch (see partition.Config
	// Tracer). Nil: no tracing.
	TracerProvider trace.TracerProvider
	// ProgressEvery is how often the engine logs, per projection, one
	// line of what its partitions did (records applied, stale,
	// dead-lettered, lag) when anything moved (default
	// DefaultProgressEvery; negative: never).
	ProgressEvery time.Duration
	// ReclaimAfter is how long a partition the group assigns to this
	// member, but whose worker a newer owner fenced (another member of
	// the same identity in another group, or a stale assignment), waits
	// before the member claims it back: it does so once the partition has
	// had records to apply and its stored offset has not moved for
	// ReclaimAfter, so that a newer owner that applies records keeps the
	// partition and one that is gone does not orphan it (default
	// DefaultReclaimAfter).
	ReclaimAfter time.Duration
	// TombstoneRetention is how long a deleted aggregate's tombstone is
	// kept, for the projections that do not set their own
	// (projection.Projection.TombstoneRetention); older ones are pruned
	// in the background when the Store is a TombstonePruner. Like
	// Kafka's delete.retention.ms, it must exceed the time a late copy
	// of an aggregate's events may still arrive: one arriving after its
	// tombstone was pruned may write the row again. 0:
	// DefaultTombstoneRetention; negative: kept forever.
	TombstoneRetention time.Duration
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the engine's metrics (default: a private
	// registry, i.e. not exported).
	Registerer prometheus.Registerer
	// ClientOpts are extra franz-go options (TLS, SASL, timeouts).
	ClientOpts []kgo.Opt
}

// DefaultShutdownTimeout is how long a member that is told to stop waits
// for its planned batches to commit unless told otherwise: well inside
// Kubernetes' default grace period of 30 seconds, leaving time to leave
// the group and exit before the pod is killed.
const DefaultShutdownTimeout = 20 * time.Second

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
	if c.Store == nil {
		return errors.New("config: Store: the store of sinks and offsets is required (postgres.NewStore for Postgres)")
	}
	names := map[string]bool{}
	for _, p := range c.Projections {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("config: Projections: %w", err)
		}
		if names[p.Name] {
			return fmt.Errorf("config: Projections: projection %q is given twice", p.Name)
		}
		names[p.Name] = true
	}
	if err := projection.CheckShared(c.Projections); err != nil {
		return fmt.Errorf("config: Projections: %w", err)
	}
	if err := c.Partition.Validate(); err != nil {
		return fmt.Errorf("config: Partition: %w", err)
	}
	if c.Partition.ClassifyDecode == nil {
		// Without it a registry that does not answer would dead-letter
		// every record instead of being waited for.
		c.Partition.ClassifyDecode = ClassifyDecode
	}
	switch c.StartFrom {
	case "":
		c.StartFrom = StartEarliest
	case StartEarliest, StartLatest:
	default:
		return fmt.Errorf("config: StartFrom: %q, want earliest or latest", c.StartFrom)
	}
	switch c.GroupProtocol {
	case "":
		c.GroupProtocol = GroupProtocolClassic
	case GroupProtocolClassic, GroupProtocolConsumer:
	default:
		return fmt.Errorf("config: GroupProtocol: %q, want classic or consumer", c.GroupProtocol)
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
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = DefaultProgressEvery
	}
	if c.ReclaimAfter <= 0 {
		c.ReclaimAfter = DefaultReclaimAfter
	}
	if c.TombstoneRetention == 0 {
		c.TombstoneRetention = DefaultTombstoneRetention
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

// Store makes the sinks and offset stores an engine runs its projections
// with, as a driver does for a database client: the engine never names a
// concrete one.
type Store interface {
	// Offsets returns the offset store of a consumer identity.
	Offsets(identity string) sinks.Offsets
	// Sink returns the sink of one projection of a consumer identity.
	Sink(t sinks.Target) (sinks.Sink, error)
	// Ping reports whether the store answers (for /readyz).
	Ping(ctx context.Context) error
}

// DeadLetterStore is a Store that keeps dead letters in Postgres: the
// engine exports how many are open, and with DLQTopic set it publishes
// them from the pool's outbox.
type DeadLetterStore interface {
	DeadLetterDepth(ctx context.Context, identity string) (map[string]int64, error)
	DeadLetterPool() *pgxpool.Pool
}

// generation is one consumer identity's run of the projections: the
// offset store of that identity and a sink per projection. An engine runs
// one; a rebuild would run a second under its own identity beside it.
type generation struct {
	identity string
	offsets  sinks.Offsets
	sinks    map[string]*sinkOf // by projection name
}

// sinkOf is a projection's sink with its optional capabilities, resolved
// once when the engine is built.
type sinkOf struct {
	sinks.Sink
	forget     sinks.Forgetter         // nil: keeps nothing of a partition
	cache      sinks.CacheReporter     // nil: no state cache to export
	tombstones sinks.TombstoneReporter // nil: no tombstone checks to export
}

func newSinkOf(s sinks.Sink) *sinkOf {
	so := &sinkOf{Sink: s}
	so.forget, _ = s.(sinks.Forgetter)
	so.cache, _ = s.(sinks.CacheReporter)
	so.tombstones, _ = s.(sinks.TombstoneReporter)
	return so
}

// Engine runs the projections of one consumer identity as one member of
// its consumer group: one worker goroutine per assigned partition.
type Engine struct {
	cfg  Config
	gen  *generation
	dead DeadLetterStore // nil: the store keeps no dead letters to count or publish
	// byTopic lists the projections each topic feeds, in the order of
	// Config.Projections; the first one's worker runs the others as lanes.
	byTopic   map[string][]*projection.Projection
	decoders  map[string]partition.Decoder // by projection name
	repairers map[string]partition.Repairer
	// sqlRepairs are the SQL repair sources, whose pools Run opens.
	sqlRepairs []sqlRepair
	closers    []func()
	metrics    *partition.Metrics
	group      *groupMetrics
	log        *slog.Logger

	// opts are the client's options, built by New; Run makes the client.
	opts []kgo.Opt
	cl   *kgo.Client
	adm  *kadm.Client
	// protocol sees which group protocol the client speaks.
	protocol *protocolWatch
	// clientReady is closed once cl and adm are set: the group may call
	// back before kgo.NewClient has returned.
	clientReady chan struct{}

	// ran is set by the first Run, stopped by the first Stop; endRun
	// ends Run's context (all under mu). done is closed when Run has
	// returned.
	ran, stopped bool
	endRun       context.CancelFunc
	done         chan struct{}

	runCtx context.Context
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[sinks.TP]*running
	owned   atomic.Int64 // len(workers), for the workers' shares
	// closing is set once Run stops its workers: a partition assigned
	// after that (the group rebalancing while the member leaves) gets no
	// worker that Run would then have to wait for.
	closing bool

	// rewinds holds the workers' requests to fetch their partition again
	// from an earlier offset, served in the poll loop (under mu);
	// stopPoll ends the poll in progress so that they need not wait for
	// records.
	rewinds  []rewind
	stopPoll atomic.Pointer[context.CancelFunc]

	// outOfLog holds the partitions whose stored offset is not in the log
	// (under mu; see offsetLost).
	outOfLog map[sinks.TP]*lostPartition
	now      func() time.Time
	// watch are the intervals of watchKafka, kafka what it found.
	watch watchTimes
	kafka kafkaWatch
	// adopt holds the partitions whose worker was fenced, with the epoch
	// it had (under mu; see adoptReset).
	adopt map[sinks.TP]int64
	// haltsDue is set when the halted partitions are to be looked at
	// for an operator's offset reset (under mu; see watchHalts).
	haltsDue bool
	// orphans holds the partitions the group assigns here that have no
	// worker because a newer owner claimed them (under mu; see orphan.go);
	// orphansDue is set when they are to be looked at again.
	orphans    map[sinks.TP]*orphan
	orphansDue bool
	// stateRec records the partitions' states for projector status (nil:
	// the store keeps none); only the stall watch uses it.
	stateRec *stateRecord
	// pruner prunes tombstones past their retention (nil: none to prune).
	pruner *tombstonePruner
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
	tp sinks.TP
	w  *partition.Worker // set once the worker is built
}

func (f *fetcher) PauseFetchPartitions(tps map[string][]int32) map[string][]int32 {
	return f.e.cl.PauseFetchPartitions(tps)
}

func (f *fetcher) ResumeFetchPartitions(tps map[string][]int32) { f.e.cl.ResumeFetchPartitions(tps) }

// Rewind implements partition.Rewinder.
func (f *fetcher) Rewind(_ sinks.TP, offset int64, done func()) {
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
	epoch  int64 // the owner epoch it claimed
	cancel context.CancelFunc
	done   chan struct{}
}

// New builds an engine. It connects to nothing and starts no goroutine:
// Run does both, and owns what it starts until it returns.
func New(cfg Config, decoderOf Decoders) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:         cfg,
		gen:         &generation{identity: cfg.Identity, offsets: cfg.Store.Offsets(cfg.Identity), sinks: map[string]*sinkOf{}},
		byTopic:     map[string][]*projection.Projection{},
		decoders:    map[string]partition.Decoder{},
		repairers:   map[string]partition.Repairer{},
		log:         cfg.Logger.With("group", cfg.Identity),
		workers:     map[sinks.TP]*running{},
		outOfLog:    map[sinks.TP]*lostPartition{},
		adopt:       map[sinks.TP]int64{},
		orphans:     map[sinks.TP]*orphan{},
		now:         time.Now,
		watch:       defaultWatchTimes.with(cfg.ProgressEvery),
		kafka:       kafkaWatch{said: map[string]time.Time{}},
		clientReady: make(chan struct{}),
		done:        make(chan struct{}),
	}
	e.dead, _ = cfg.Store.(DeadLetterStore)
	e.stateRec = newStateRecord(cfg.Store, cfg.InstanceID)
	if budget := cfg.MemberMaxRecords; budget >= 0 {
		if budget == 0 {
			budget = DefaultMemberMaxRecords
		}
		// Half for the batches being applied, half for the buffers.
		e.cfg.Partition.Share = func() int { return budget / 2 / int(max(e.owned.Load(), 1)) }
	}
	var topics []string
	for _, p := range cfg.Projections {
		if len(e.byTopic[p.Topic]) == 0 {
			topics = append(topics, p.Topic)
		}
		e.byTopic[p.Topic] = append(e.byTopic[p.Topic], p)
		sink, err := cfg.Store.Sink(sinks.Target{
			Identity: cfg.Identity, Projection: p, DLQTopic: cfg.DLQTopic,
			StateCacheRows: cfg.StateCacheRows, StateCacheBytes: cfg.StateCacheBytes,
		})
		if err != nil {
			e.close()
			return nil, fmt.Errorf("sink of projection %s: %w", p.Name, err)
		}
		e.gen.sinks[p.Name] = newSinkOf(sink)
		e.decoders[p.Name] = decoderOf(p)
		if p.OnGap != projection.GapRepair {
			continue
		}
		r, err := e.repairerOf(p)
		if err != nil {
			return nil, err
		}
		if r != nil { // nil: a SQL source, which Run opens
			e.repairers[p.Topic] = r
		}
	}
	for t, ps := range e.byTopic {
		if _, ok := e.gen.sinks[ps[0].Name].Sink.(sinks.LaneCommitter); len(ps) > 1 && !ok {
			e.close()
			return nil, fmt.Errorf("config: Projections: topic %q feeds projections %q and %q, and the store's sinks cannot commit them in one transaction (no sinks.LaneCommitter): give each its own topic or consumer identity", t, ps[0].Name, ps[1].Name)
		}
	}
	if cfg.TracerProvider != nil {
		e.cfg.Partition.Tracer = cfg.TracerProvider.Tracer("github.com/projector-dev/projector")
	}
	e.metrics = partition.NewMetrics(cfg.Registerer)
	for _, p := range cfg.Projections {
		e.metrics.Known(p.Name, p.Topic)
	}
	e.group = newGroupMetrics(cfg.Registerer, cfg.Identity)
	e.group.stalled = newStalledGauge(cfg.Registerer, cfg.Identity)
	cfg.Registerer.MustRegister(&lagCollector{e: e})
	e.pruner = newTombstonePruner(&e.cfg, e.log)

	opts := []kgo.Opt{
		kgo.ConsumerGroup(cfg.Identity),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
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
		// default left caught-up members idle for seconds at a time, and
		// the Java consumer's 500ms still held a partition of hot
		// aggregates behind fetches held open for idle ones. A member
		// with nothing to fetch sends ten fetches a second per broker.
		kgo.FetchMaxWait(fetchMaxWait),
		// A partition paused with a fetch in flight has that fetch's data
		// dropped and fetched again after it resumes. With franz-go's 1 MiB
		// per partition a single fetch outgrew a worker's buffer, so nearly
		// every fetch of a busy partition ended in a pause, and most records
		// were fetched and decompressed more than once. 256 KiB keeps a
		// fetch well inside the buffer (ClientOpts can override).
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
		kgo.OnPartitionsAssigned(e.assigned),
		kgo.OnPartitionsRevoked(e.revoked),
		kgo.OnPartitionsLost(e.lost),
		kgo.AdjustFetchOffsetsFn(e.claim),
	}
	if cfg.GroupProtocol == GroupProtocolConsumer {
		// Used with a sticky or range balancer only, which the
		// cooperative-sticky balancer is; the brokers' uniform assignor
		// then assigns.
		opts = append(opts, kgo.ServerSideBalancer())
	}
	// Under the consumer protocol too: it applies should the brokers
	// not offer that one.
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	e.protocol = &protocolWatch{want: e.cfg.GroupProtocol, log: e.log}
	opts = append(opts, kgo.WithHooks(e.protocol))
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	e.opts = kafkaclient.ConsumerOptions(kafkaclient.Config{Brokers: cfg.Brokers, Registerer: cfg.Registerer, Logger: cfg.Logger, Extra: cfg.ClientOpts}, opts...)
	return e, nil
}

// ErrRunTwice is returned by a second Run: an engine runs once.
var ErrRunTwice = errors.New("projector: Run called twice: build a new engine to run again")

// Stop ends Run as the end of its context does and waits, until ctx
// ends, for Run to return (Run itself waits at most ShutdownTimeout for
// the workers). Calling it again, or on an engine that never ran, is
// safe; a Run called after Stop returns at once.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	e.stopped = true
	ran, end := e.ran, e.endRun
	e.mu.Unlock()
	if !ran {
		return nil
	}
	end()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop: Run has not returned: %w", ctx.Err())
	}
}

// client returns the engine's Kafka client, nil until Run has made it.
func (e *Engine) client() *kgo.Client {
	select {
	case <-e.clientReady:
		return e.cl
	default:
		return nil
	}
}

// Run consumes until ctx ends, then stops fetching, lets every worker
// commit the batches it has planned (within ShutdownTimeout; those still
// open then are abandoned and read again by the next owner), leaves the
// group and returns. The workers do not run under ctx: its end must not
// cancel the transactions that carry their last batches.
func (e *Engine) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.mu.Lock()
	if e.ran {
		e.mu.Unlock()
		return ErrRunTwice
	}
	e.ran, e.endRun = true, cancel
	stopped := e.stopped
	e.runCtx = runCtx
	e.mu.Unlock()
	defer close(e.done)
	if stopped {
		return nil
	}
	for _, r := range e.sqlRepairs {
		pool, err := pgxpool.NewWithConfig(runCtx, r.pool)
		if err != nil {
			e.close()
			return fmt.Errorf("projection %q: repair.sql.database_url: %w", r.projection, err)
		}
		e.closers = append(e.closers, pool.Close)
		rep, err := repair.NewSQL(pool, repair.SQLConfig{Query: r.query})
		if err != nil {
			e.close()
			return fmt.Errorf("projection %q: repair.sql: %w", r.projection, err)
		}
		e.repairers[r.topic] = rep
	}
	if e.cfg.GroupProtocol == GroupProtocolConsumer && e.cfg.SessionTimeout > 0 {
		e.log.Warn("the session timeout given (--session-timeout, SessionTimeout) does not apply under the consumer group protocol: the brokers' group.consumer.session.timeout.ms "+
			"(or the group's consumer.session.timeout.ms) does; it applies only should the brokers not offer the consumer protocol",
			"session_timeout", e.cfg.SessionTimeout, "group_protocol", e.cfg.GroupProtocol)
	}
	cl, err := kgo.NewClient(e.opts...)
	if err != nil {
		e.close()
		return fmt.Errorf("kafka client: %w", err)
	}
	e.cl = cl
	e.adm = kadm.NewClient(cl)
	close(e.clientReady)
	defer func() {
		e.stopAll(e.cfg.ShutdownTimeout)
		// A poll may have returned records without letting the group
		// rebalance; leaving the group needs that.
		e.cl.AllowRebalance()
		e.cl.Close()
		e.wg.Wait()
		e.clearStates()
		e.close()
	}()
	e.wg.Add(4)
	go func() {
		defer e.wg.Done()
		e.watchStalls(runCtx)
	}()
	go func() {
		defer e.wg.Done()
		e.watchHalts(runCtx)
	}()
	go func() {
		defer e.wg.Done()
		e.watchOrphans(runCtx)
	}()
	go func() {
		defer e.wg.Done()
		e.watchKafka(runCtx)
	}()
	if e.pruner != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.pruner.run(runCtx)
		}()
	}
	if e.cfg.DLQTopic != "" && e.dead != nil {
		pub := dlqpublish.New(e.dead.DeadLetterPool(), e.cl, e.log, time.Second)
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
				e.offsetLost(runCtx, sinks.TP{Topic: topic, Partition: p})
			default:
				e.log.Error("fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		e.mu.Lock()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if r := e.workers[sinks.TP{Topic: fp.Topic, Partition: fp.Partition}]; r != nil {
				r.w.Push(fp.Records, fp.HighWatermark)
			}
		})
		e.mu.Unlock()
		e.recheckLost(runCtx)
		e.recheckOrphans(runCtx)
		e.rewound()
		e.cl.AllowRebalance()
	}
}

func (e *Engine) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	<-e.clientReady
	e.group.assignedNow(assigned)
	e.log.Info("partitions assigned", "partitions", assigned, "group_protocol", e.protocol.inUse())
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
	var tps []sinks.TP
	for t, ps := range offsets {
		for p := range ps {
			tps = append(tps, sinks.TP{Topic: t, Partition: p})
		}
	}
	if len(tps) == 0 {
		return offsets, nil
	}
	var claims []sinks.Claimed
	err := retry(ctx, e.log, e.retryPolicy(), "claim partitions", func() (err error) {
		claims, err = e.gen.offsets.Claim(ctx, tps)
		return err
	})
	if err != nil {
		return nil, err
	}
	starts, err := e.startOffsets(ctx, claims)
	if err != nil {
		return nil, err
	}
	out := make(map[string]map[int32]kgo.Offset, len(offsets))
	for _, c := range claims {
		next, ok := starts[c.TP]
		if !ok {
			e.orphaned(c.TP, c.Epoch, "claimed by a newer owner before its worker started")
			continue
		}
		if out[c.Topic] == nil {
			out[c.Topic] = map[int32]kgo.Offset{}
		}
		out[c.Topic][c.Partition] = kgo.NewOffset().At(next).WithEpoch(-1)
		e.start(sinks.Claim{TP: c.TP, Epoch: c.Epoch, NextOffset: next, Since: c.At})
	}
	return out, nil
}

// startOffsets returns where each claimed partition resumes: its stored
// next offset, or for a partition with none the start position resolved
// and stored now. The partitions without one are listed together, in one
// ListOffsets request per broker, and stored in one statement: a member
// claiming thousands of fresh partitions in the group callback must not
// list them one at a time while the group waits. A partition a newer
// owner claimed meanwhile is left out.
func (e *Engine) startOffsets(ctx context.Context, claims []sinks.Claimed) (map[sinks.TP]int64, error) {
	out := make(map[sinks.TP]int64, len(claims))
	var fresh []sinks.Claimed
	topics := map[string]bool{}
	for _, c := range claims {
		if c.NextOffset != nil {
			out[c.TP] = *c.NextOffset
			continue
		}
		fresh = append(fresh, c)
		topics[c.Topic] = true
	}
	if len(fresh) == 0 {
		return out, nil
	}
	names := slices.Sorted(maps.Keys(topics))
	list := e.adm.ListStartOffsets
	if e.cfg.StartFrom == StartLatest {
		list = e.adm.ListEndOffsets
	}
	firsts := make([]int64, len(fresh))
	err := retry(ctx, e.log, e.retryPolicy(), "resolve start offsets", func() error {
		res, err := list(ctx, names...)
		if err != nil {
			return fmt.Errorf("list %s offsets of %d partitions: %w", e.cfg.StartFrom, len(fresh), err)
		}
		for i, c := range fresh {
			o, ok := res.Lookup(c.Topic, c.Partition)
			if !ok {
				return fmt.Errorf("no offset listed for %s/%d", c.Topic, c.Partition)
			}
			if o.Err != nil {
				return fmt.Errorf("list offset of %s/%d: %w", c.Topic, c.Partition, o.Err)
			}
			firsts[i] = o.Offset
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var stored []sinks.TP
	err = retry(ctx, e.log, e.retryPolicy(), "store start offsets", func() (err error) {
		stored, err = e.gen.offsets.InitAll(ctx, fresh, firsts)
		return err
	})
	if err != nil {
		return nil, err
	}
	at := make(map[sinks.TP]int64, len(fresh))
	for i, c := range fresh {
		at[c.TP] = firsts[i]
	}
	for _, tp := range stored {
		out[tp] = at[tp]
	}
	return out, nil
}

func (e *Engine) start(c sinks.Claim) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	e.unorphan(c.TP)
	if old := e.workers[c.TP]; old != nil {
		// Reassigned before the old worker was removed: it is fenced by the
		// new epoch anyway; stop it without waiting under the lock.
		old.w.Stop()
		old.cancel()
	}
	ps := e.byTopic[c.Topic]
	p := ps[0]
	var others []partition.Lane
	for _, o := range ps[1:] {
		others = append(others, partition.Lane{Projection: o, Sink: e.gen.sinks[o.Name].Sink, Decoder: e.decoders[o.Name]})
	}
	f := &fetcher{e: e, tp: c.TP}
	w := partition.NewWorker(e.cfg.Partition, partition.WorkerDeps{
		Group: e.gen.identity, Claim: c, Projection: p, Sink: e.gen.sinks[p.Name].Sink, Decoder: e.decoders[p.Name],
		Repairer: e.repairers[c.Topic], Fetcher: f, Log: e.log, Metrics: e.metrics, Now: e.now, Others: others,
	})
	f.w = w
	parent := e.runCtx
	if parent == nil {
		parent = context.Background()
	}
	// A worker outlives Run's context by up to ShutdownTimeout, committing
	// what it has planned; only its own cancel (when it is abandoned)
	// interrupts its transactions.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	r := &running{w: w, epoch: c.Epoch, cancel: cancel, done: make(chan struct{})}
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
			current := e.workers[c.TP] == r
			if current {
				delete(e.workers, c.TP)
				e.owned.Store(int64(len(e.workers)))
				// Under mu, so that it cannot overtake the resume of a
				// worker started for the partition after this one.
				e.cl.PauseFetchPartitions(map[string][]int32{c.Topic: {c.Partition}})
				if errors.Is(err, sinks.ErrFenced) {
					// Perhaps by an operator's offset reset rather than
					// a newer member: the poll loop finds out.
					e.adopt[c.TP] = c.Epoch
				}
			}
			e.mu.Unlock()
			if stop := e.stopPoll.Load(); current && stop != nil {
				(*stop)()
			}
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
			tp := sinks.TP{Topic: t, Partition: p}
			if r := e.workers[tp]; r != nil {
				delete(e.workers, tp)
				e.owned.Store(int64(len(e.workers)))
				r.w.Stop()
				stopping = append(stopping, r)
			}
		}
	}
	for t, ps := range tps {
		for _, p := range ps {
			tp := sinks.TP{Topic: t, Partition: p}
			delete(e.adopt, tp)
			e.unorphan(tp)
		}
	}
	e.mu.Unlock()
	e.forgetLost(tps)
	e.cl.ResumeFetchPartitions(tps)
	e.wait(stopping, e.cfg.RevokeTimeout, "revoked")
	for t, parts := range tps {
		for _, proj := range e.byTopic[t] {
			if f := e.gen.sinks[proj.Name].forget; f != nil {
				for _, p := range parts {
					f.Forget(sinks.TP{Topic: t, Partition: p})
				}
			}
		}
	}
}

// stopAll stops every worker as the member shuts down and waits for them,
// each committing what it has planned within timeout or being abandoned.
func (e *Engine) stopAll(timeout time.Duration) {
	e.mu.Lock()
	e.closing = true
	for tp := range e.orphans {
		e.unorphan(tp)
	}
	stopping := make([]*running, 0, len(e.workers))
	for tp, r := range e.workers {
		delete(e.workers, tp)
		e.owned.Store(int64(len(e.workers)))
		r.w.Drain()
		stopping = append(stopping, r)
	}
	e.mu.Unlock()
	if len(stopping) > 0 {
		e.log.Info("shutting down: committing the batches planned", "partitions", len(stopping), "timeout", timeout)
	}
	e.forgetLost(nil)
	e.wait(stopping, timeout, "shutting down")
}

// wait waits for the stopping workers, cancelling those still running
// after timeout: their open batches are abandoned (why says what stopped
// them, for the one log line that names them).
func (e *Engine) wait(stopping []*running, timeout time.Duration, why string) {
	abandon := time.AfterFunc(timeout, func() {
		var open []string
		for _, r := range stopping {
			select {
			case <-r.done:
			default:
				tp := r.w.TP()
				open = append(open, tp.Topic+"/"+strconv.Itoa(int(tp.Partition)))
				r.cancel()
			}
		}
		if len(open) > 0 {
			slices.Sort(open)
			e.log.Warn(why+": open batches abandoned after the timeout; they will be read again",
				"timeout", timeout, "partitions", open)
		}
	})
	defer abandon.Stop()
	for _, r := range stopping {
		<-r.done
	}
}

// Why a partition's stored offset is not in its log, as the reason label
// of projector_partition_halted says.
const (
	// haltRecordsDeleted: retention deleted records from the stored offset
	// on before they were applied (the offset is below the log start).
	haltRecordsDeleted = "records_deleted"
	// haltBeyondLogEnd: the offset is past the log end, so the log is not
	// the one the offset was stored from (the topic was deleted and
	// created again) or it lost acknowledged records.
	haltBeyondLogEnd = "beyond_log_end"
	// haltUnknown: the log's bounds could not be listed; they are listed
	// again after lostRecheck.
	haltUnknown = "unknown"
)

// haltKinds gives the halt each reason label of projector_partition_halted
// is (see sinks.PartitionState.Halt).
var haltKinds = map[string]string{
	haltRecordsDeleted: sinks.HaltRecordsDeleted,
	haltBeyondLogEnd:   sinks.HaltBeyondLogEnd,
	haltUnknown:        sinks.HaltOffsetNotInLog,
}

// haltLogEvery is how often a halted partition's error is logged again
// when the condition is seen again: once is enough to act on, and a
// broker answering every fetch at once must not flood the log.
const haltLogEvery = time.Minute

// ResetCheckInterval is how often a halted partition is looked at again:
// its log's bounds listed again when they could not be listed, and its
// stored offset checked for an operator's reset (projector offsets reset),
// from which it then resumes, whatever halted it (see watchHalts).
const ResetCheckInterval = 10 * time.Second

const lostRecheck = ResetCheckInterval

// lostPartition is a partition whose stored offset the broker reported
// out of range, for its current worker.
type lostPartition struct {
	w       *partition.Worker
	kind    string      // why it halted: haltRecordsDeleted, haltBeyondLogEnd or haltUnknown; "" not yet known
	logged  time.Time   // when its error was last logged
	recheck *time.Timer // set while it is halted (see armRecheck)
	due     bool        // the recheck timer has fired
}

// offsetLost handles a partition whose stored offset the broker reported
// out of range. It compares the offset with the log's bounds: below the
// log start, retention deleted records before they were applied (halt, or
// skip to the log start with OnOffsetLost skip); past the log end, the
// log is not the one the offset came from (always halt: skipping cannot
// help). A halted partition's fetching is paused, so that the client does
// not ask again and again, and its error is logged once, then at most
// once per haltLogEvery. It runs in the poll loop, where moving the fetch
// position is safe.
func (e *Engine) offsetLost(ctx context.Context, tp sinks.TP) {
	e.mu.Lock()
	r := e.workers[tp]
	lp := e.outOfLog[tp]
	if r != nil && (lp == nil || lp.w != r.w) {
		if lp != nil && lp.recheck != nil {
			lp.recheck.Stop() // of the partition's previous worker
		}
		lp = &lostPartition{w: r.w}
		e.outOfLog[tp] = lp
	}
	waiting := lp != nil && lp.recheck != nil && !lp.due
	e.mu.Unlock()
	if r == nil {
		return
	}
	if lp.kind == haltRecordsDeleted || lp.kind == haltBeyondLogEnd || waiting {
		// Seen again (a fetch answered before the pause took effect):
		// nothing changed, so no new listing.
		e.logLost(lp, lp.kind, r.w.Status())
		return
	}
	st := r.w.Status()
	logStart, logEnd, err := e.logBounds(ctx, tp)
	e.mu.Lock()
	lp.due = false
	if lp.recheck != nil {
		lp.recheck.Stop()
		lp.recheck = nil
	}
	e.mu.Unlock()
	var kind, reason string
	switch {
	case err != nil:
		kind = haltUnknown
		reason = fmt.Sprintf("the stored offset %d is not in the log, and the log's bounds could not be listed (%v); checking again in %s",
			st.NextOffset, err, lostRecheck)
	case st.NextOffset < logStart:
		if e.cfg.OnOffsetLost == OffsetLostSkip {
			e.skipLost(ctx, r, lp, st.NextOffset, logStart)
			return
		}
		kind = haltRecordsDeleted
		reason = fmt.Sprintf("records from offset %d to %d were deleted by retention (the log now starts at %d) before they were applied; "+
			"the partition is halted: restore them, or run with --on-offset-lost=skip to continue from the log start and lose them "+
			"(or move the stored offset with: projector offsets reset --topic %s --partitions %d --to-earliest --execute)",
			st.NextOffset, logStart-1, logStart, tp.Topic, tp.Partition)
	case st.NextOffset > logEnd:
		kind = haltBeyondLogEnd
		reason = fmt.Sprintf("the stored offset %d is beyond the log end %d (the log starts at %d): the topic was deleted and created again, "+
			"or the partition lost records it had acknowledged; the partition is halted and --on-offset-lost=skip does not apply: "+
			"check that this log is the one the projection was built from, then move the stored offset with: "+
			"projector offsets reset --topic %s --partitions %d --to-earliest --execute (or --to-latest)",
			st.NextOffset, logEnd, logStart, tp.Topic, tp.Partition)
	case st.Halted != "":
		// Halted for a reason that went away (the bounds could be listed
		// again, or records were produced since): fetching goes on. lp
		// stays, so that the error is still logged at most once per
		// haltLogEvery should the broker say out of range again.
		r.w.Unhalt()
		e.setHalted(tp, "")
		return
	default:
		// The stored offset is in the log, the fetch position was not (the
		// worker had fetched past a log end that then moved back): wait,
		// paused, and look again, rather than ask at every fetch.
		kind = haltUnknown
		reason = fmt.Sprintf("the broker reports the fetch position out of range although the stored offset %d is in the log [%d, %d]; checking again in %s",
			st.NextOffset, logStart, logEnd, lostRecheck)
	}
	r.w.Halt(haltKinds[kind], reason)
	e.setHalted(tp, kind)
	e.mu.Lock()
	if lp.kind != kind {
		lp.logged = time.Time{} // news: said at once
	}
	lp.kind = kind
	e.armRecheck(lp)
	e.mu.Unlock()
	e.logLost(lp, kind, r.w.Status())
}

// armRecheck has the poll loop look at a halted partition again after
// lostRecheck: list the log's bounds again when they could not be listed,
// and otherwise look for an operator's reset of the stored offset. Call
// with mu held.
func (e *Engine) armRecheck(lp *lostPartition) {
	lp.due = false
	lp.recheck = time.AfterFunc(lostRecheck, func() {
		e.mu.Lock()
		lp.due = true
		e.mu.Unlock()
		if stop := e.stopPoll.Load(); stop != nil {
			(*stop)()
		}
	})
}

// logBounds lists the log start and end offsets of a partition.
func (e *Engine) logBounds(ctx context.Context, tp sinks.TP) (start, end int64, err error) {
	lookup := func(list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		res, err := list(ctx, tp.Topic)
		if err != nil {
			return 0, err
		}
		o, ok := res.Lookup(tp.Topic, tp.Partition)
		if !ok {
			return 0, fmt.Errorf("no offset listed for %s/%d", tp.Topic, tp.Partition)
		}
		return o.Offset, o.Err
	}
	if start, err = lookup(e.adm.ListStartOffsets); err != nil {
		return 0, 0, fmt.Errorf("list log start of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	if end, err = lookup(e.adm.ListEndOffsets); err != nil {
		return 0, 0, fmt.Errorf("list log end of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return start, end, nil
}

// skipLost moves a partition whose records retention deleted to the log
// start (OnOffsetLost skip).
func (e *Engine) skipLost(ctx context.Context, r *running, lp *lostPartition, from, logStart int64) {
	tp := r.w.TP()
	if err := r.w.SkipTo(ctx, logStart); err != nil {
		e.log.Error("skipping deleted records failed", "topic", tp.Topic, "partition", tp.Partition, "from", from, "to", logStart, "err", err)
		return
	}
	e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: logStart}}})
	e.mu.Lock()
	if e.outOfLog[tp] == lp {
		delete(e.outOfLog, tp)
	}
	e.mu.Unlock()
	e.setHalted(tp, "")
}

// logLost logs a halted partition's error unless it was logged less than
// haltLogEvery ago.
func (e *Engine) logLost(lp *lostPartition, kind string, st partition.Status) {
	now := e.now()
	e.mu.Lock()
	quiet := !lp.logged.IsZero() && now.Sub(lp.logged) < haltLogEvery
	if !quiet {
		lp.logged = now
	}
	e.mu.Unlock()
	if quiet || st.Halted == "" {
		return
	}
	msg := "partition halted: records were deleted before they were applied"
	switch kind {
	case haltBeyondLogEnd:
		msg = "partition halted: stored offset is beyond the log end"
	case haltUnknown:
		msg = "partition halted: stored offset is not in the log"
	}
	e.log.Error(msg, "topic", st.Topic, "partition", st.Partition, "stored_offset", st.NextOffset, "reason", st.Halted)
}

// setHalted sets projector_partition_halted of a partition to 1 for the
// reason kind and removes it for the others ("": halted for none).
func (e *Engine) setHalted(tp sinks.TP, kind string) {
	p := strconv.Itoa(int(tp.Partition))
	for _, k := range []string{haltRecordsDeleted, haltBeyondLogEnd, haltUnknown} {
		if k == kind {
			e.group.halted.WithLabelValues(tp.Topic, p, k).Set(1)
		} else {
			e.group.halted.DeleteLabelValues(tp.Topic, p, k)
		}
	}
}

// recheckLost looks again at the halted partitions whose recheck is due
// (see armRecheck and watchHalts), and at the partitions whose worker was
// fenced.
func (e *Engine) recheckLost(ctx context.Context) {
	type check struct {
		tp              sinks.TP
		epoch           int64
		unknown, halted bool
	}
	var checks []check
	e.mu.Lock()
	for tp, lp := range e.outOfLog {
		r := e.workers[tp]
		if !lp.due || r == nil || r.w != lp.w {
			continue
		}
		checks = append(checks, check{tp: tp, epoch: r.epoch, unknown: lp.kind == haltUnknown, halted: true})
		if lp.kind != haltUnknown {
			e.armRecheck(lp)
		}
	}
	for tp, epoch := range e.adopt {
		checks = append(checks, check{tp: tp, epoch: epoch})
	}
	clear(e.adopt)
	for _, h := range e.haltedDue() {
		checks = append(checks, check{tp: h.tp, epoch: h.epoch, halted: true})
	}
	e.mu.Unlock()
	for _, c := range checks {
		adopted := e.adoptReset(ctx, c.tp, c.epoch, !c.halted)
		switch {
		case !adopted && c.unknown:
			e.offsetLost(ctx, c.tp)
		case !adopted && !c.halted:
			// Fenced by a newer owner, not by an operator's reset, while
			// the group still assigns the partition here.
			e.orphaned(c.tp, c.epoch, "its worker was fenced: a newer owner claimed it")
		}
	}
}

// adoptReset takes a partition up again from its new stored offset when
// an operator reset it (projector offsets reset) while this member owned
// it at epoch mine: the reset fenced the member's worker, or the worker
// is halted and would never commit. A partition a newer member claimed
// is left alone. It runs in the poll loop, between rebalances, so the
// partition is still assigned here. A failed look is logged when it was
// the only one (fenced); a halted partition looks again anyway.
func (e *Engine) adoptReset(ctx context.Context, tp sinks.TP, mine int64, fenced bool) (adopted bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, ok, err := e.gen.offsets.Adopt(ctx, tp, mine)
	if err != nil {
		level := slog.LevelDebug
		if fenced {
			level = slog.LevelWarn
		}
		e.log.Log(ctx, level, "looking for an offset reset of a fenced or halted partition failed", "topic", tp.Topic, "partition", tp.Partition, "err", err)
		return false
	}
	if !ok {
		return false
	}
	e.forgetLost(map[string][]int32{tp.Topic: {tp.Partition}})
	halt := e.retire(tp)
	e.start(sinks.Claim{TP: tp, Epoch: c.Epoch, NextOffset: *c.NextOffset, Since: c.At})
	e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: *c.NextOffset}}})
	if halt != "" {
		e.log.Warn("halted partition resumes from an operator's offset reset", "topic", tp.Topic, "partition", tp.Partition, "next_offset", *c.NextOffset, "halt", halt)
	} else {
		e.log.Warn("partition resumes from an operator's offset reset", "topic", tp.Topic, "partition", tp.Partition, "next_offset", *c.NextOffset)
	}
	return true
}

// forgetLost drops what offsetLost knew of partitions this member no
// longer runs (nil: all); their new owner finds out for itself.
func (e *Engine) forgetLost(tps map[string][]int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for tp, lp := range e.outOfLog {
		if tps != nil && !slices.Contains(tps[tp.Topic], tp.Partition) {
			continue
		}
		if lp.recheck != nil {
			lp.recheck.Stop()
		}
		delete(e.outOfLog, tp)
		e.setHalted(tp, "")
	}
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
	if cl := e.client(); cl == nil {
		checks["group"] = errors.New("not running")
	} else if !inGroup(cl) {
		checks["group"] = errors.New("not joined to the consumer group yet")
	} else {
		checks["group"] = nil
	}
	checks["kafka"] = e.kafka.current()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	checks["postgres"] = e.cfg.Store.Ping(ctx)
	var stuck []string
	for _, s := range e.Workers() {
		if s.Unready {
			stuck = append(stuck, fmt.Sprintf("%s/%d backing off since %s", s.Topic, s.Partition, s.BackoffSince.UTC().Format(time.RFC3339)))
		}
		if s.Halted != "" {
			stuck = append(stuck, fmt.Sprintf("%s/%d halted: %s", s.Topic, s.Partition, s.Halted))
		}
	}
	for _, o := range e.orphanStatus() {
		stuck = append(stuck, fmt.Sprintf("%s/%d orphaned since %s: %s", o.Topic, o.Partition, o.Since.UTC().Format(time.RFC3339), o.Reason))
	}
	checks["partitions"] = nil
	if len(stuck) > 0 {
		slices.Sort(stuck)
		checks["partitions"] = errors.New(strings.Join(stuck, "; "))
	}
	return checks
}

// Client is the engine's Kafka client (for admin calls; do not poll it),
// nil until Run has made it; Run closes it when it returns.
func (e *Engine) Client() *kgo.Client { return e.client() }

// retryPolicy is the backoff of the engine's own database work (claims,
// start offsets): the partitions' --retry-base and --retry-cap, so that one
// setting governs every retry against Postgres.
func (e *Engine) retryPolicy() backoff.Policy {
	return backoff.Policy{Base: e.cfg.Partition.RetryBase, Cap: e.cfg.Partition.RetryCap}
}

// retry runs fn with p's backoff between attempts until it succeeds or
// ctx ends.
func retry(ctx context.Context, log *slog.Logger, p backoff.Policy, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || errors.Is(err, sinks.ErrFenced) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		delay := p.Delay(attempt)
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

// repairerOf returns the repair source of a projection with on_gap repair:
// nil for a SQL source, which it checks and Run opens.
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
	pc, err := pgxpool.ParseConfig(spec.SQLDatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("projection %q: repair.sql.database_url: %w", p.Name, err)
	}
	if strings.TrimSpace(spec.SQLQuery) == "" {
		return nil, fmt.Errorf("projection %q: repair.sql: query is required", p.Name)
	}
	// The pool connects, so Run opens it.
	e.sqlRepairs = append(e.sqlRepairs, sqlRepair{topic: p.Topic, projection: p.Name, pool: pc, query: spec.SQLQuery})
	return nil, nil
}

// sqlRepair is a SQL repair source New has checked and Run opens.
type sqlRepair struct {
	topic, projection string
	pool              *pgxpool.Config
	query             string
}

func (e *Engine) close() {
	for _, c := range e.closers {
		c()
	}
	e.closers = nil
}
