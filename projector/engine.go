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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

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
	// mirror commits the stored offsets to the Kafka group too (nil:
	// KafkaCommitInterval turned it off).
	mirror *groupMirror
	// drain estimates how long each topic's backlog takes to drain.
	drain *drainEstimate
	// unowned is the lag of partitions no member runs that this member
	// exports, and the record times of its halted partitions (see
	// unowned.go).
	unowned unownedLag
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
		drain:       newDrainEstimate(DrainWindow),
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
	// Every metric of the engine carries its consumer group, so that
	// engines of several identities (generations run side by side) share
	// one registry.
	group := prometheus.Labels{"group": cfg.Identity}
	grouped := prometheus.WrapRegistererWith(group, cfg.Registerer)
	e.metrics = partition.NewMetrics(cfg.Registerer, group)
	for _, p := range cfg.Projections {
		e.metrics.Known(p.Name, p.Topic)
	}
	e.group = newGroupMetrics(cfg.Registerer, group)
	e.group.stalled = newStalledGauge(cfg.Registerer, group)
	grouped.MustRegister(&lagCollector{e: e})
	e.pruner = newTombstonePruner(&e.cfg, e.log)
	e.mirror = newGroupMirror(e.cfg.KafkaCommitInterval, e.log, func() time.Time { return e.now() }, cfg.Registerer, group)

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
	e.opts = kafkaclient.ConsumerOptions(kafkaclient.Config{Brokers: cfg.Brokers, Registerer: grouped, Logger: cfg.Logger, Extra: cfg.ClientOpts}, opts...)
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
	if err := e.openSQLRepairs(runCtx); err != nil {
		e.close()
		return err
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
		stopped := e.stopAll(e.cfg.ShutdownTimeout)
		// The partitions are still this member's until it leaves: the
		// group gets their last stored offsets first.
		e.mirror.flush(e.cl, nil)
		// A poll may have returned records without letting the group
		// rebalance; leaving the group needs that.
		e.cl.AllowRebalance()
		e.cl.Close()
		e.wg.Wait()
		if e.cfg.InstanceID != "" {
			// A static member does not leave its group: its partitions
			// stay assigned to it until its session times out, and
			// another member exports their lag meanwhile (unowned.go).
			e.releaseStates(stopped)
		} else {
			e.clearStates()
		}
		e.close()
	}()
	e.wg.Add(5)
	go func() {
		defer e.wg.Done()
		e.watchStalls(runCtx)
	}()
	go func() {
		defer e.wg.Done()
		e.watchLag(runCtx)
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
	if e.mirror != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.mirror.run(runCtx, e.cl)
		}()
	}
	if e.pruner != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.pruner.run(runCtx)
		}()
	}
	if e.dead != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.watchRedrives(runCtx)
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
	// The workers have committed their last batches: the group gets
	// those offsets before the partitions move on, and nothing of them
	// after.
	e.mirror.flush(e.cl, revoked)
	e.mirror.drop(revoked)
}

func (e *Engine) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-e.clientReady
	e.group.removed(lost)
	e.group.lost.Add(float64(count(lost)))
	e.log.Warn("partitions lost", "partitions", lost)
	// Another member may own them already: nothing more of them is
	// committed to the group.
	e.mirror.drop(lost)
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
	e.mirror.own(c.TP, c.Epoch, c.NextOffset)
	var stored func(int64)
	if e.mirror != nil {
		stored = func(end int64) { e.mirror.stored(c.TP, c.Epoch, end) }
	}
	w := partition.NewWorker(e.cfg.Partition, partition.WorkerDeps{
		Group: e.gen.identity, Claim: c, Projection: p, Sink: e.gen.sinks[p.Name].Sink, Decoder: e.decoders[p.Name],
		Repairer: e.repairers[c.Topic], Fetcher: f, Log: e.log, Metrics: e.metrics, Now: e.now, Others: others,
		Stored: stored, Redrives: e.redriveSource(),
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
					// A newer owner's offsets are its own to commit.
					e.mirror.dropOne(c.TP, c.Epoch)
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
// It returns the partitions it stopped.
func (e *Engine) stopAll(timeout time.Duration) []sinks.TP {
	e.mu.Lock()
	e.closing = true
	for tp := range e.orphans {
		e.unorphan(tp)
	}
	stopping := make([]*running, 0, len(e.workers))
	tps := make([]sinks.TP, 0, len(e.workers))
	for tp, r := range e.workers {
		tps = append(tps, tp)
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
	return tps
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

func (e *Engine) close() {
	for _, c := range e.closers {
		c()
	}
	e.closers = nil
}
