package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/internal/cliflag"
	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/stopsignal"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projection/check"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// The backoff after a transient failure, at run time and at startup.
const (
	defaultRetryBase = backoff.DefaultBase
	defaultRetryCap  = backoff.DefaultCap
)

type runFlags struct {
	common
	dbFlags
	// clientOpts are the Kafka client's transport (TLS, SASL) of the
	// --kafka-* flags, built by run once they are checked.
	clientOpts      []kgo.Opt
	httpAddr        string
	startFrom       string
	batchMaxRecords int
	commitMax       int
	stateCacheRows  int
	memberMax       int
	stateCacheBytes cliflag.ByteSize
	batchMaxWait    time.Duration
	revokeTimeout   time.Duration
	shutdownTimeout time.Duration
	groupProtocol   string
	sessionTimeout  time.Duration
	instanceID      string
	maxAttempts     int
	maxRecordBytes  int
	maxKeyBytes     int
	retryBase       time.Duration
	retryCap        time.Duration
	unreadyAfter    time.Duration
	stallAfter      time.Duration
	reclaimAfter    time.Duration
	progressEvery   time.Duration
	kafkaCommit     time.Duration
	dlqTopic        string
	onOffsetLost    string
	checkWriters    string
	stormShare      cliflag.Share
	stormWindow     int

	tombstoneRetention retentionFlag
	rebuild            rebuildFlags
	adminAPI           bool
	// api serves the read API in the engine's process (--api).
	api         bool
	apiFlags    apiFlags
	apiMaxConns int
	// throttle paces the engine of a generation being rebuilt.
	throttle partition.Throttle
}

func runCommand(_, stderr io.Writer) *ffcli.Command {
	f := &runFlags{}
	return newCommand("run", "projector run [flags]", "Consume the configured topics into their projections as one member of the group.", stderr,
		f.register,
		func(ctx context.Context, _ []string) error {
			return f.run(ctx, stderr)
		})
}

// run runs the engine on the brokers and registry of --brokers and
// --registry-url.
func (f *runFlags) run(ctx context.Context, stderr io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.adminAPI {
		return errAdminAPIMoved
	}
	if f.api {
		if err := f.apiFlags.validate(); err != nil {
			return err
		}
		if f.apiMaxConns < 1 {
			return fmt.Errorf("--api-max-conns %d: must be at least 1", f.apiMaxConns)
		}
	}
	if f.registryURL == "" {
		return errors.New("--registry-url (PROJECTOR_REGISTRY_URL) is required: the Schema Registry the producers use")
	}
	kcfg, err := f.kafkaConfig(nil, nil)
	if err != nil {
		return err
	}
	f.clientOpts = kafkaclient.TransportOptions(kcfg)
	return f.runOn(ctx, stderr, engineEnv{brokers: kcfg.Brokers})
}

// engineEnv is where runOn finds Kafka and the registry, and what a
// command running it (dev) adds around it.
type engineEnv struct {
	brokers []string
	// registry, when not nil, is used instead of --registry-url's.
	registry *sr.Client
	// awaitSchemas: a projection whose reader schema is to come from
	// the registry waits for one to be registered instead of stopping
	// startup (dev, whose registry starts empty).
	awaitSchemas bool
	// migrated, when not nil, runs once the tables exist and before the
	// engine is built.
	migrated func(ctx context.Context, pool *pgxpool.Pool) error
	// running, when not nil, is called once the engine is built, with
	// the database it writes and the address the HTTP surface listens
	// on (nil: none).
	running func(target dbTarget, http net.Addr)
}

// runOn checks everything that needs neither DDL nor the group (flags, the
// projection file, the registry's schemas, the HTTP address) before it
// touches either, so that a replica that cannot start leaves no tables
// behind and does not make the group rebalance for nothing. f is
// validated already.
func (f *runFlags) runOn(ctx context.Context, stderr io.Writer, env engineEnv) error {
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	defer stopsignal.LogHangup(ctx, log)()
	if f.api {
		if err := f.apiFlags.prepare(log); err != nil {
			return err
		}
	}
	brokers := env.brokers
	projs, err := projection.Load(f.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	poolCfg, err := f.dbFlags.poolConfig(f.database())
	if err != nil {
		return err
	}
	reg := env.registry
	if reg == nil {
		if reg, err = f.registryClient(); err != nil {
			return err
		}
	}
	var readers map[string]avro.Schema
	if env.awaitSchemas {
		readers, err = awaitReaderSchemas(ctx, log, reg, projs)
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
	} else {
		readers, err = readerSchemas(ctx, reg, projs)
	}
	if err != nil {
		return err
	}
	ln, err := listen(f.httpAddr)
	if err != nil {
		return err
	}
	var apiLn net.Listener
	if f.api {
		if apiLn, err = f.apiFlags.listen(); err != nil {
			if ln != nil {
				ln.Close()
			}
			return err
		}
		defer apiLn.Close()
	}
	metrics := newRegistry()
	gather := &gatherers{base: metrics}
	tp, shutdown, err := tracing(ctx)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx) // best effort: spans of the last seconds
	}()
	var (
		engine   atomic.Pointer[rebuild.Supervisor]
		starting starting
	)
	step := starting.step
	step("connecting to PostgreSQL")
	ready := func(ctx context.Context) map[string]error {
		return starting.ready(ctx, func() readiness {
			if e := engine.Load(); e != nil {
				return e
			}
			return nil
		})
	}
	live := func(ctx context.Context) map[string]error {
		if e := engine.Load(); e != nil {
			return e.Live(ctx)
		}
		return map[string]error{"startup": nil}
	}
	su := newStartup(log, metrics, f.startupTimeout, f.retryBase, f.retryCap, &starting)
	return serveOn(ctx, log, ln, gather, ready, live, func(ctx context.Context) error {
		sctx, cancel := su.bound(ctx)
		defer cancel()
		// Behind a pooler, PostgreSQL's connection slots are the
		// pooler's to share, not this member's to count.
		pool, target, err := openDatabase(sctx, poolCfg, su, f.dbFlags.pooler == poolerNone)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
		defer pool.Close()
		if err := su.do(sctx, "connect", func(ctx context.Context) error { return f.dbFlags.checkPooler(ctx, pool, "run", log) }); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		log.Info("writing to PostgreSQL", append(target.attrs(), "max_conns", poolCfg.MaxConns,
			// Behind a pooler they are not startup parameters.
			"lock_timeout", cmp.Or(poolCfg.ConnConfig.RuntimeParams["lock_timeout"], f.dbFlags.settings["lock_timeout"]),
			"idle_in_transaction_session_timeout", cmp.Or(poolCfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"], f.dbFlags.settings["idle_in_transaction_session_timeout"]),
			"database_pooler", f.dbFlags.pooler)...)
		step("reading the projections' generations")
		store := rebuild.NewStore(pool)
		// What runs is each projection as its live generation defines
		// it: a file that defines one otherwise starts no migration, it
		// asks for a rebuild.
		var live []*projection.Projection
		err = su.do(sctx, "read generations", func(ctx context.Context) error {
			live, err = liveProjections(ctx, store, f.identity, projs)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		step("checking the projection file")
		if err := checkBeforeRun(sctx, su, log, live, reg, readers, pool, f.checkWriters); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		step("creating what is missing of the tables")
		if err := migrate(sctx, su, pool, target, live); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := su.do(sctx, "migrate", func(ctx context.Context) error { return rebuild.Migrate(ctx, pool) }); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if env.migrated != nil {
			if err := env.migrated(sctx, pool); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		step("joining the consumer group")
		adm, closeAdm, err := adminClient(f, brokers, log)
		if err != nil {
			return err
		}
		defer closeAdm()
		engines := &generationEngines{f: f, brokers: brokers, registry: reg, log: log, pool: pool, tp: tp, gather: gather, poolCfg: poolCfg,
			readers: readers, schemas: map[string]string{}}
		for _, p := range projs {
			engines.schemas[p.Name] = p.Schema
		}
		defer engines.close()
		sup := newSupervisor(f, projs, store, adm, engines, pool, metrics, log)
		engine.Store(sup)
		if env.running != nil {
			var addr net.Addr
			if ln != nil {
				addr = ln.Addr()
			}
			env.running(target, addr)
		}
		log.Info("projector running", "identity", f.identity, "config", f.config, "group_protocol", f.groupProtocol,
			"batch_max_records", f.batchMaxRecords, "batch_max_wait", f.batchMaxWait.String(), "commit_max_batches", f.commitMax,
			"member_max_records", f.memberMax,
			"state_cache_rows", f.stateCacheRows, "state_cache_bytes", f.stateCacheBytes.String())
		if apiLn == nil {
			return sup.Run(ctx)
		}
		return f.runWithAPI(ctx, sctx, log, apiLn, poolCfg, projs, metrics, adm, sup.Run)
	})
}

// runWithAPI runs the engine (run) and the read API of --api side by
// side until ctx ends or either stops; the API reads the projections by
// their table names (a rebuilt projection's is a view of its live
// generation) from a pool of its own.
func (f *runFlags) runWithAPI(ctx, sctx context.Context, log *slog.Logger, ln net.Listener, poolCfg *pgxpool.Config, projs []*projection.Projection,
	metrics prometheus.Registerer, adm *kadm.Client, run func(context.Context) error) error {
	cfg := poolCfg.Copy()
	cfg.MaxConns = int32(f.apiMaxConns)
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(sctx, cfg)
	if err != nil {
		return fmt.Errorf("read API: open its pool: %w", err)
	}
	defer pool.Close()
	api, watcher, err := f.apiFlags.newAPI(projs, pool, f.identity, log, metrics)
	if err != nil {
		return err
	}
	// The API's pool may write (the engine's settings, not serve's read
	// only ones): the admin API shares it.
	h, err := f.apiFlags.withAdmin(api, pool, f.identity, offsetResetter{adm: adm, offsets: postgres.NewOffsets(pool, f.identity), group: f.identity}, log)
	if err != nil {
		return err
	}
	// The engine stopping, with or without an error, stops the API.
	errEngineStopped := errors.New("the engine stopped")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveAPI(gctx, log, ln, h, watcher) })
	g.Go(func() error {
		if err := run(gctx); err != nil {
			return err
		}
		return errEngineStopped
	})
	if err := g.Wait(); !errors.Is(err, errEngineStopped) {
		return err
	}
	return nil
}

// checkBeforeRun proves the projections as projector check does, against
// every writer version or the latest (writers), before anything is
// created or joined: a file with problems would dead-letter or fail every
// event it meets. Its error lists every problem, one a line.
func checkBeforeRun(ctx context.Context, su startup, log *slog.Logger, projs []*projection.Projection, reg *sr.Client, readers map[string]avro.Schema, pool *pgxpool.Pool, writers string) error {
	var rep *check.Report
	err := su.do(ctx, "check", func(ctx context.Context) error {
		var err error
		rep, err = check.Run(ctx, check.Config{Projections: projs, Registry: reg, Readers: readers, DB: pool, RequireDB: true, Writers: writers})
		return err
	})
	if err != nil {
		return err
	}
	for _, n := range rep.Notes {
		log.Info("check: " + n)
	}
	if err := rep.Err(); err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	return nil
}

// migrate creates what is missing of the engine's and the projections'
// tables, retried as su says.
func migrate(ctx context.Context, su startup, pool *pgxpool.Pool, target dbTarget, projs []*projection.Projection) error {
	err := su.do(ctx, "migrate", func(ctx context.Context) error {
		return postgres.Migrate(ctx, pool, projs...)
	})
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w", target, err)
	}
	return nil
}

func (f *runFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "brokers", "registry-url")
	f.registerEngine(fs)
	registerAdminAPI(fs, &f.adminAPI)
	fs.BoolVar(&f.api, "api", false, "also serve the read API on --api-addr, as projector serve does, from a pool of its own (--api-max-conns) so that reads never take the engine's connections")
	f.apiFlags.register(fs)
	fs.IntVar(&f.apiMaxConns, "api-max-conns", 4, "most PostgreSQL connections the read API of --api opens, besides --database-max-conns")
}

// registerEngine registers the flags of the engine itself, which run and
// dev share.
func (f *runFlags) registerEngine(fs *flag.FlagSet) {
	f.common.register(fs, "database-url", "identity", "config", "log")
	f.dbFlags.register(fs, "pool", "sessions", "pooler", "startup")
	registerTombstoneRetention(fs, &f.tombstoneRetention)
	f.rebuild.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "address of /metrics, /livez, /readyz; empty disables")
	fs.StringVar(&f.startFrom, "start-from", projector.StartEarliest, "where a partition without a stored offset starts: earliest or latest")
	fs.IntVar(&f.batchMaxRecords, "batch-max-records", partition.DefaultBatchMaxRecords, "most records planned together in one batch")
	fs.IntVar(&f.commitMax, "commit-max-batches", partition.DefaultCommitMaxBatches, "most full batches' worth of records one transaction covers while a partition is behind, each aggregate's row written once for all of them; 1: a transaction per batch")
	fs.IntVar(&f.memberMax, "member-max-records", projector.DefaultMemberMaxRecords, "records this member holds across its partitions, buffered or in a batch being applied: each partition's batch and buffer get an equal share of it, when that is less than --batch-max-records, and a transaction of several batches holds the rows of at most as many aggregates as its partition's share (a partition holds two while one commits and the next is planned); 0: no bound")
	fs.DurationVar(&f.batchMaxWait, "batch-max-wait", 50*time.Millisecond, "longest a batch waits for more records after its first")
	fs.IntVar(&f.stateCacheRows, "state-cache-rows", postgres.DefaultStateCacheRows, "aggregates per projection whose rows are kept in memory, so a batch reads only the others from Postgres; 0 disables")
	f.stateCacheBytes = postgres.DefaultStateCacheBytes
	fs.Var(&f.stateCacheBytes, "state-cache-bytes", "memory per projection for those rows, whichever bound comes first, e.g. 256MiB; 0 disables")
	fs.StringVar(&f.groupProtocol, "group-protocol", projector.GroupProtocolClassic, "consumer group protocol: classic, or consumer (KIP-848, Kafka 4.0 or later: the brokers assign the partitions and own the session timeout, group.consumer.session.timeout.ms; brokers without it are joined with classic, warned once); Kafka's group.protocol")
	fs.DurationVar(&f.sessionTimeout, "session-timeout", 45*time.Second, "how long the group waits for a silent member before reassigning its partitions; Kafka's session.timeout.ms. Classic group protocol only: under consumer the brokers' group.consumer.session.timeout.ms applies")
	fs.StringVar(&f.instanceID, "instance-id", "", "static group membership id, e.g. the pod name of a StatefulSet, under either group protocol; Kafka's group.instance.id")
	fs.IntVar(&f.maxAttempts, "max-attempts", 5, "attempts for an error that may succeed on retry (unknown schema id, fold error) before the record is dead-lettered")
	fs.IntVar(&f.maxRecordBytes, "max-record-bytes", 1<<20, "records with a larger value are dead-lettered")
	fs.IntVar(&f.maxKeyBytes, "max-key-bytes", partition.DefaultMaxKeyBytes, "records with a longer key are dead-lettered (class invalid_key), as are keys that are not UTF-8 or hold a NUL byte: a key is a text index entry of several tables, which holds at most about 2700 bytes; at most 2400, 0: no limit")
	registerRetry(fs, &f.retryBase, &f.retryCap)
	fs.DurationVar(&f.unreadyAfter, "unready-after", 30*time.Second, "a partition backing off longer than this makes /readyz fail")
	fs.DurationVar(&f.progressEvery, "progress-every", projector.DefaultProgressEvery, "how often each projection logs one line of progress (records applied, stale, dead-lettered, lag) when anything moved; 0: never")
	fs.DurationVar(&f.kafkaCommit, "kafka-commit-interval", projector.DefaultKafkaCommitInterval, "how often the offsets stored in PostgreSQL are also committed to the identity's Kafka consumer group, so that kafka-consumer-groups, Burrow and KEDA see its lag (advisory: never read back; a failure is counted and logged, never fatal); 0: never, the group's offsets are left alone")
	fs.DurationVar(&f.stallAfter, "stall-after", partition.DefaultStallAfter, "a partition with records to apply that commits nothing for this long is stalled: an error line, projector_partition_stalled, and /livez fails so that the member is restarted")
	fs.DurationVar(&f.reclaimAfter, "reclaim-after", projector.DefaultReclaimAfter, "a partition the group assigns to this member but another owner of the same identity claimed (a second member outside the group) is claimed back once its records have waited this long with its stored offset unmoved")
	f.stormShare = partition.DefaultDeadLetterStormShare
	fs.Var(&f.stormShare, "dead-letter-storm-share", "a partition halts, rather than commit a batch and move its offset on, when more than this share of its last --dead-letter-storm-window records would be dead letters of one class; it tries the batch again every --retry-cap. The guard judges once 100 records (or the whole window) are in view; off (the word: 0 is refused) lets every failing record be dead-lettered")
	fs.IntVar(&f.stormWindow, "dead-letter-storm-window", partition.DefaultDeadLetterStormWindow, "how many of a partition's most recent records the dead-letter storm guard looks at")
	fs.StringVar(&f.dlqTopic, "dlq-topic", "", "also publish dead letters to this Kafka topic, with Kafka Connect's __connect.errors.* headers")
	fs.StringVar(&f.onOffsetLost, "on-offset-lost", projector.OffsetLostHalt, "when retention deleted records before they were applied: halt the partition, or skip to the log start")
	fs.StringVar(&f.checkWriters, "check-writers", check.WritersAll, "which registered writer versions of each subject the startup check proves the reader schema against: all, or latest when the topics no longer hold events of older ones")
	fs.DurationVar(&f.revokeTimeout, "revoke-timeout", 10*time.Second, "longest a revoked partition may take to finish its open batch")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", projector.DefaultShutdownTimeout, "on SIGTERM or SIGHUP, longest the member waits for its planned batches to commit before it abandons them and leaves the group; keep it below the grace period the process is given, 30s on Kubernetes")
}

func (f *runFlags) validate() error {
	if err := f.rebuild.validate(); err != nil {
		return err
	}
	if f.batchMaxRecords < 1 {
		return fmt.Errorf("--batch-max-records %d: must be at least 1", f.batchMaxRecords)
	}
	if f.commitMax < 1 {
		return fmt.Errorf("--commit-max-batches %d: must be at least 1", f.commitMax)
	}
	if f.stateCacheRows < 0 {
		return fmt.Errorf("--state-cache-rows %d: must be 0 (off) or more", f.stateCacheRows)
	}
	if f.memberMax < 0 {
		return fmt.Errorf("--member-max-records %d: must be 0 (no bound) or more", f.memberMax)
	}
	if f.batchMaxWait <= 0 {
		return fmt.Errorf("--batch-max-wait %s: must be positive", f.batchMaxWait)
	}
	if f.shutdownTimeout <= 0 {
		return fmt.Errorf("--shutdown-timeout %s: must be positive", f.shutdownTimeout)
	}
	if f.maxAttempts < 1 {
		return fmt.Errorf("--max-attempts %d: must be at least 1", f.maxAttempts)
	}
	if f.maxRecordBytes < 1 {
		return fmt.Errorf("--max-record-bytes %d: must be at least 1", f.maxRecordBytes)
	}
	if f.dlqTopic != "" {
		if err := projection.CheckTopic(f.dlqTopic); err != nil {
			return fmt.Errorf("--dlq-topic: %w", err)
		}
		if f.dbFlags.pooler == poolerTransaction {
			return errors.New("--dlq-topic " + f.dlqTopic + ": " + dlqNeedsSession)
		}
	}
	if f.maxKeyBytes < 0 || f.maxKeyBytes > 2400 {
		return fmt.Errorf("--max-key-bytes %d: must be 0 (no limit) to 2400 (a key is a B-tree index entry, which holds at most 2704 bytes)", f.maxKeyBytes)
	}
	if f.stormWindow < 1 {
		return fmt.Errorf("--dead-letter-storm-window %d: must be at least 1 record", f.stormWindow)
	}
	if err := validateRetry(f.retryBase, f.retryCap); err != nil {
		return err
	}
	if f.progressEvery < 0 {
		return fmt.Errorf("--progress-every %s: must be 0 (never) or positive", f.progressEvery)
	}
	if f.reclaimAfter <= 0 {
		return fmt.Errorf("--reclaim-after %s: must be positive", f.reclaimAfter)
	}
	if f.stallAfter <= f.retryCap {
		return fmt.Errorf("--stall-after %s: must be longer than --retry-cap %s, or a partition waiting out one backoff would count as stalled", f.stallAfter, f.retryCap)
	}
	if f.onOffsetLost != projector.OffsetLostHalt && f.onOffsetLost != projector.OffsetLostSkip {
		return fmt.Errorf("--on-offset-lost %q: want halt or skip", f.onOffsetLost)
	}
	if f.checkWriters != check.WritersAll && f.checkWriters != check.WritersLatest {
		return fmt.Errorf("--check-writers %q: want all or latest", f.checkWriters)
	}
	if f.startFrom != projector.StartEarliest && f.startFrom != projector.StartLatest {
		return fmt.Errorf("--start-from %q: want earliest or latest", f.startFrom)
	}
	if f.groupProtocol != projector.GroupProtocolClassic && f.groupProtocol != projector.GroupProtocolConsumer {
		return fmt.Errorf("--group-protocol %q: want classic or consumer", f.groupProtocol)
	}
	return f.dbFlags.validate()
}

// readerSchemas returns each projection's reader schema: the one in its
// file, or else the latest registered for "<topic>-value".
func readerSchemas(ctx context.Context, reg *sr.Client, projs []*projection.Projection) (map[string]avro.Schema, error) {
	out := map[string]avro.Schema{}
	for _, p := range projs {
		s, err := schemas.ReaderSchema(ctx, reg, p.Schema, p.Topic+"-value")
		if err != nil {
			return nil, fmt.Errorf("projection %q: set schema: in the projection file or register the topic's value schema: %w", p.Name, err)
		}
		out[p.Name] = s
	}
	return out, nil
}

// schemaPoll is how often a projection waiting for its schema asks the
// registry again.
const schemaPoll = 500 * time.Millisecond

// awaitReaderSchemas is readerSchemas on a registry that may not hold a
// projection's schema yet: a subject not found is waited for, said once
// per projection, until every projection has its reader schema or ctx
// ends. Any other failure stops startup as readerSchemas does.
func awaitReaderSchemas(ctx context.Context, log *slog.Logger, reg *sr.Client, projs []*projection.Projection) (map[string]avro.Schema, error) {
	out := map[string]avro.Schema{}
	told := map[string]bool{}
	t := time.NewTicker(schemaPoll)
	defer t.Stop()
	for {
		waiting := 0
		for _, p := range projs {
			if _, ok := out[p.Name]; ok {
				continue
			}
			subject := p.Topic + "-value"
			s, err := schemas.ReaderSchema(ctx, reg, p.Schema, subject)
			var re *sr.ResponseError
			switch {
			case err == nil:
				out[p.Name] = s
				if told[p.Name] {
					log.Info("schema registered: the projection starts", "projection", p.Name, "subject", subject)
				}
			case p.Schema == "" && errors.As(err, &re) && noSchemaYet(re.ErrorCode):
				waiting++
				if !told[p.Name] {
					told[p.Name] = true
					log.Info(fmt.Sprintf("waiting for a schema under subject %s: register one with projector produce --topic %s --schema FILE.avsc --key-field %s < events.jsonl", subject, p.Topic, p.KeyField),
						"projection", p.Name, "subject", subject)
				}
			default:
				return nil, fmt.Errorf("projection %q: set schema: in the projection file or register the topic's value schema: %w", p.Name, err)
			}
		}
		if waiting == 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// noSchemaYet reports whether a registry's error code for a subject's
// latest version means nothing is registered there yet: Confluent's
// registry says subject not found, Apicurio's version not found.
func noSchemaYet(code int) bool {
	return code == sr.ErrSubjectNotFound.Code || code == sr.ErrVersionNotFound.Code
}

// listen binds the HTTP address (nil for an empty one), so that an address
// in use stops a command before it does anything else.
func listen(httpAddr string) (net.Listener, error) {
	if httpAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w", httpAddr, err)
	}
	return ln, nil
}

// serve runs work (an engine or a relay) with its HTTP surface — metrics
// from reg, readiness from ready, liveness from live (nil: the process
// answers) — until ctx ends.
func serve(ctx context.Context, log *slog.Logger, httpAddr string, reg prometheus.Gatherer, ready, live projector.ReadyFunc, work func(context.Context) error) error {
	ln, err := listen(httpAddr)
	if err != nil {
		return err
	}
	return serveOn(ctx, log, ln, reg, ready, live, work)
}

// serveOn is serve on a bound listener; nil serves no HTTP. Each of wrap
// wraps the handler (run's admin API).
func serveOn(ctx context.Context, log *slog.Logger, ln net.Listener, reg prometheus.Gatherer, ready, live projector.ReadyFunc, work func(context.Context) error, wrap ...func(http.Handler) http.Handler) error {
	g, ctx := errgroup.WithContext(ctx)
	if ln != nil {
		h := projector.Handler(reg, ready, live)
		for _, w := range wrap {
			h = w(h)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		log.Info("serving metrics and health", "addr", ln.Addr().String())
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	g.Go(func() error { return work(ctx) })
	return g.Wait()
}

// newRegistry returns a metrics registry with the Go runtime, process and
// build-info collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)
	return reg
}

// engineSessionTimeout is --session-timeout for the engine: under the
// consumer group protocol only when it was given, for the engine to warn
// that the brokers' session timeout applies instead (its default would
// warn every member that never set it).
func (f *runFlags) engineSessionTimeout() time.Duration {
	if f.groupProtocol == projector.GroupProtocolConsumer && !f.set("session-timeout") {
		return 0
	}
	return f.sessionTimeout
}

// maxKeyBytes is --max-key-bytes as partition.Config takes it: the flag's
// 0 (no limit) is the engine's negative.
func maxKeyBytes(flag int) int {
	if flag == 0 {
		return -1
	}
	return flag
}

// newEngine builds the engine of the projections, decoding with readers.
func newEngine(f *runFlags, brokers []string, projs []*projection.Projection, reg *sr.Client, readers map[string]avro.Schema, log *slog.Logger, pool *pgxpool.Pool, metrics prometheus.Registerer, tp trace.TracerProvider) (*projector.Engine, error) {
	return projector.New(projector.Config{
		Brokers:     brokers,
		Identity:    f.identity,
		Projections: projs,
		StartFrom:   f.startFrom,
		Partition: partition.Config{
			BatchMaxRecords:  f.batchMaxRecords,
			BatchMaxWait:     f.batchMaxWait,
			CommitMaxBatches: f.commitMax,
			MaxAttempts:      f.maxAttempts,
			MaxRecordBytes:   f.maxRecordBytes,
			MaxKeyBytes:      maxKeyBytes(f.maxKeyBytes),
			RetryBase:        f.retryBase,
			RetryCap:         f.retryCap,
			UnreadyAfter:     f.unreadyAfter,
			StallAfter:       f.stallAfter,
			// The flag's off is the engine's negative share.
			DeadLetterStormShare:  cliflag.ShareOff(f.stormShare),
			DeadLetterStormWindow: f.stormWindow,
			Throttle:              f.throttle,
		},
		MemberMaxRecords: cliflag.Off(f.memberMax),
		StateCacheRows:   cliflag.Off(f.stateCacheRows),
		StateCacheBytes:  cliflag.CacheBytes(f.stateCacheBytes),
		DLQTopic:         f.dlqTopic,
		OnOffsetLost:     f.onOffsetLost,
		RevokeTimeout:    f.revokeTimeout,
		ShutdownTimeout:  f.shutdownTimeout,
		ReclaimAfter:     f.reclaimAfter,
		GroupProtocol:    f.groupProtocol,
		SessionTimeout:   f.engineSessionTimeout(),
		InstanceID:       f.instanceID,
		ProgressEvery:    cliflag.OffDuration(f.progressEvery),
		Logger:           log,
		Registerer:       metrics,
		TracerProvider:   tp,
		ClientOpts:       f.clientOpts,
		Store:            postgres.NewStore(pool),

		// The flag's off is the engine's negative retention.
		TombstoneRetention: time.Duration(f.tombstoneRetention),

		// The flag's 0 (never) is the engine's negative.
		KafkaCommitInterval: cliflag.OffDuration(f.kafkaCommit),
	}, projector.PrunedDecoders(reg, readers)) // only the fields each projection reads are decoded
}
