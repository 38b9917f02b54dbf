package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/schemas"
)

// Defaults of Config.
const (
	DefaultBatchSize       = 500
	DefaultPollInterval    = time.Second
	DefaultShards          = 16
	DefaultRetention       = 24 * time.Hour
	DefaultCleanupInterval = time.Minute
	DefaultUnreadyAfter    = 5 * time.Second
)

// MaxShards bounds Config.Shards.
const MaxShards = 1024

// deleteBatch is the most published rows one retention statement deletes.
const deleteBatch = 10_000

// Config configures a Relay.
type Config struct {
	// Client produces the records; required. It must be idempotent with
	// acks from all in-sync replicas (franz-go's default): per-partition
	// order then survives retries. Records keep the client's partitioner
	// (by default the Kafka-compatible hash of the key). Its linger adds
	// to the latency once per batch.
	Client *kgo.Client
	// Registry encodes events written with a Value (a *sr.Client);
	// events with a Payload do not need it.
	Registry schemas.Subjects
	// BatchSize is the most rows one round claims and publishes (default
	// 500). A crash between the broker's acknowledgement and the marking
	// publishes at most this many again.
	BatchSize int
	// PollInterval is how often the relay looks for work without a
	// notification, and rebalances shards among replicas (default 1s).
	PollInterval time.Duration
	// Shards is the number of aggregate shards (default 16); every
	// replica sharing an outbox must use the same number, and a relay
	// refuses to run beside one that does not.
	Shards int
	// Retention is how long published rows are kept (default 24h;
	// negative: forever).
	Retention time.Duration
	// CleanupInterval is how often published rows past Retention are
	// deleted and rows blocked by an unencodable value are retried
	// (default 1m).
	CleanupInterval time.Duration
	// RetryBase and RetryCap bound the exponential backoff with full
	// jitter after a failed round or database session: the delay before
	// retry n is random in [0, min(RetryCap, RetryBase·2^n)] (defaults
	// 100ms and 30s, as projector run's --retry-base and --retry-cap).
	RetryBase, RetryCap time.Duration
	// UnreadyAfter is how long records may wait for the broker's
	// acknowledgement before the relay logs a warning (again once a
	// minute while it lasts), sets projector_outbox_produce_stalled and
	// fails Ready's "kafka" check, until the broker acknowledges again
	// (default 5s).
	UnreadyAfter time.Duration
	// Logger receives the relay's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the relay's metrics (default: a private
	// registry).
	Registerer prometheus.Registerer
}

func (c *Config) validate() error {
	if c.Client == nil {
		return errors.New("outbox: Config.Client: a Kafka client is required")
	}
	if v, ok := c.Client.OptValue(kgo.DisableIdempotentWrite).(bool); ok && v {
		return errors.New("outbox: Config.Client: idempotent writes are disabled; per-aggregate order needs them")
	}
	if v, ok := c.Client.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && v != kgo.AllISRAcks() {
		return errors.New("outbox: Config.Client: RequiredAcks must be AllISRAcks; a row is marked published only once all in-sync replicas have it")
	}
	if v, ok := c.Client.OptValue(kgo.TransactionalID).(string); ok && v != "" {
		return errors.New("outbox: Config.Client: a transactional client is not supported")
	}
	if reg, ok := c.Registry.(*sr.Client); ok && reg == nil {
		c.Registry = nil
	}
	switch {
	case c.BatchSize == 0:
		c.BatchSize = DefaultBatchSize
	case c.BatchSize < 0 || c.BatchSize > 100_000:
		return fmt.Errorf("outbox: Config.BatchSize %d: want 1 to 100000", c.BatchSize)
	}
	switch {
	case c.Shards == 0:
		c.Shards = DefaultShards
	case c.Shards < 0 || c.Shards > MaxShards:
		return fmt.Errorf("outbox: Config.Shards %d: want 1 to %d", c.Shards, MaxShards)
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.CleanupInterval <= 0 {
		c.CleanupInterval = DefaultCleanupInterval
	}
	switch {
	case c.UnreadyAfter == 0:
		c.UnreadyAfter = DefaultUnreadyAfter
	case c.UnreadyAfter < 0:
		return fmt.Errorf("outbox: Config.UnreadyAfter %s: must be positive (0: the default %s)", c.UnreadyAfter, DefaultUnreadyAfter)
	}
	if c.RetryBase < 0 {
		return fmt.Errorf("outbox: Config.RetryBase %s: must not be negative", c.RetryBase)
	}
	if c.RetryCap < 0 || (c.RetryCap > 0 && c.RetryCap < c.RetryBase) {
		return fmt.Errorf("outbox: Config.RetryCap %s: want at least Config.RetryBase %s", c.RetryCap, c.RetryBase)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// Relay publishes the outbox to Kafka. See the package documentation for
// how replicas share the work and what survives a crash.
type Relay struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     *slog.Logger
	m       *metrics
	schemas *schemaCache

	up      atomic.Bool
	lastErr atomic.Pointer[error]
	stall   stall
	// indexed: the claim index of the shard count is built.
	indexed atomic.Bool
}

// New returns a relay publishing the outbox of pool's database (the
// projector_outbox table its search_path finds; run Migrate first).
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: a Postgres pool is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Relay{
		pool:    pool,
		cfg:     cfg,
		log:     cfg.Logger,
		m:       newMetrics(cfg.Registerer),
		schemas: &schemaCache{reg: cfg.Registry},
	}, nil
}

// Run publishes until ctx ends, then returns nil. Failures (Postgres,
// Kafka, the registry) are logged and retried with backoff; they never
// end Run.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { r.housekeeping(ctx) })
	wg.Go(func() { r.buildShardIndex(ctx) })
	defer wg.Wait()
	var (
		lastLog    time.Time
		lastReason string
		suppressed int
	)
	for attempt := 0; ; attempt++ {
		var healthy bool
		err := r.session(ctx, &healthy)
		r.up.Store(false)
		r.stall.reset(r) // this relay has no records waiting any more
		if ctx.Err() != nil {
			return nil
		}
		r.lastErr.Store(&err)
		// A session that did its work ended for a new reason: retry at
		// once (with jitter), not after the backoff of earlier failures.
		if healthy {
			attempt = 0
		}
		reason := sessionEndReason(err)
		r.m.restarts.WithLabelValues(reason).Inc()
		d := r.retryDelay(attempt)
		// Sessions that keep ending right after doing their work restart
		// without backoff: one reason is logged once per sessionLogEvery.
		if now := time.Now(); reason != lastReason || now.Sub(lastLog) >= sessionLogEvery {
			r.log.Error("outbox relay: database session ended; its shards are released", "reason", reason, "err", err, "retry_in", d, "repeated", suppressed)
			lastLog, lastReason, suppressed = now, reason, 0
		} else {
			suppressed++
		}
		if !sleep(ctx, d) {
			return nil
		}
	}
}

// sessionLogEvery is how often the end of a session is logged at most.
const sessionLogEvery = 10 * time.Second

// sessionEndReason is the reason label of a session's end: the connection
// could not be made, the connection was lost (the server ended the
// session, restarted, or the network failed), the outbox table is
// missing, or a statement failed.
func sessionEndReason(err error) string {
	var (
		pg *pgconn.PgError
		ce *connectError
	)
	switch {
	case errors.As(err, &ce):
		return "connect"
	case errors.As(err, &pg) && pg.Code == pgUndefinedTable:
		return "no_table"
	case errors.As(err, &pg) && !connectionSQLState(pg.Code):
		return "database_error"
	}
	return "connection_lost"
}

// pgUndefinedTable is SQLSTATE undefined_table: the only failure that
// means Migrate has not run.
const pgUndefinedTable = "42P01"

// connectionSQLState reports whether a SQLSTATE says the session itself
// ended: connection exceptions (08), the server shutting down or the
// session terminated (57P).
func connectionSQLState(code string) bool {
	return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P")
}

// connectError is a failure to open the session's connection.
type connectError struct{ err error }

func (e *connectError) Error() string { return "connect: " + e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// Ready reports whether the relay has its database session (and so may
// own shards) and whether Postgres answers; it fits projector.Handler.
func (r *Relay) Ready(ctx context.Context) map[string]error {
	checks := map[string]error{"postgres": r.pool.Ping(ctx), "kafka": r.stall.err()}
	if !r.up.Load() {
		err := errors.New("no database session yet")
		if last := r.lastErr.Load(); last != nil {
			err = fmt.Errorf("no database session: %w", *last)
		}
		checks["outbox session"] = err
	} else {
		checks["outbox session"] = nil
	}
	return checks
}

// session is one dedicated connection's lifetime: it holds the relay's
// shard locks, listens for notifications, and claims and marks rows. When
// it ends, Postgres releases the locks.
type session struct {
	conn     *pgx.Conn
	schema   string // of the outbox table, the payload of its notifications
	shardNS  int32  // first key of the shard locks
	memberNS int32  // first key of the relay membership locks
	owned    []bool
	count    int
	mismatch bool // relays with another shard count are running
	notified bool // a notification arrived while records were in flight
}

func (s *session) list() []int64 {
	out := make([]int64, 0, s.count)
	for i, o := range s.owned {
		if o {
			out = append(out, int64(i))
		}
	}
	return out
}

// namespaceSQL returns the outbox table's schema and the first keys of the
// relays' advisory locks, derived from the table's oid, so that outboxes
// in different schemas of one database do not share locks.
const namespaceSQL = `SELECT n.nspname, hashtext('projector_outbox.shard:' || c.oid), hashtext('projector_outbox.relay:' || c.oid)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = 'projector_outbox'::regclass`

func (r *Relay) session(ctx context.Context, healthy *bool) (err error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return err
	}
	s := &session{conn: conn, owned: make([]bool, r.cfg.Shards)}
	defer func() {
		r.m.owned.Sub(float64(s.count))
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.conn.Close(cctx) // ends the session: its locks go with it
	}()
	if err := s.conn.QueryRow(ctx, namespaceSQL).Scan(&s.schema, &s.shardNS, &s.memberNS); err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == pgUndefinedTable {
			return fmt.Errorf("no table projector_outbox on the search_path (run outbox.Migrate or projector migrate): %w", err)
		}
		return fmt.Errorf("find the outbox table: %w", err)
	}
	// The claim must walk an index of unpublished rows in seq order (per
	// owned shard, or all of them) and stop after BatchSize rows whatever
	// the statistics say: right after a
	// burst they can still describe an empty table, and the planner would
	// sort the whole backlog for every batch. The session runs nothing
	// else that needs a sort or a bitmap scan.
	if _, err := s.conn.Exec(ctx, "SET enable_sort = off; SET enable_bitmapscan = off; LISTEN "+Channel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var member bool
	if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared($1, $2)`, s.memberNS, r.cfg.Shards).Scan(&member); err != nil || !member {
		return fmt.Errorf("join the relays (membership lock: %v): %w", member, err)
	}
	r.up.Store(true)

	var (
		nextTick time.Time
		failures int
	)
	for {
		if !time.Now().Before(nextTick) {
			if err := r.rebalance(ctx, s); err != nil {
				return err
			}
			nextTick = time.Now().Add(r.cfg.PollInterval)
		}
		if s.count > 0 {
			n, err := r.round(ctx, s)
			var fatal *fatalError
			switch {
			case errors.As(err, &fatal):
				return fatal.err
			case err != nil:
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d := r.retryDelay(failures)
				failures++
				r.log.Warn("outbox relay: publishing failed; the rows stay unpublished and are retried", "err", err, "retry_in", d)
				if !sleep(ctx, d) {
					return ctx.Err()
				}
				continue
			}
			failures = 0
			*healthy = true
			if n == r.cfg.BatchSize || s.notified {
				s.notified = false
				continue // more is waiting
			}
		}
		if err := r.wait(ctx, s, nextTick); err != nil {
			return err
		}
		*healthy = true
	}
}

// connect returns a connection of the pool's for a session, taken out of
// the pool. A pooled connection the server has ended (a restart, a
// terminated backend) fails its ping and is closed; the next one, or a
// new one, is tried in its place, so a stale connection never costs a
// session and a backoff.
func (r *Relay) connect(ctx context.Context) (*pgx.Conn, error) {
	for tries := 1; ; tries++ {
		pc, err := r.pool.Acquire(ctx)
		if err != nil {
			return nil, &connectError{err}
		}
		conn := pc.Hijack()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = conn.Ping(pctx)
		cancel()
		if err == nil {
			return conn, nil
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil || tries > int(r.pool.Config().MaxConns) {
			return nil, &connectError{err}
		}
	}
}

// wait blocks until a notification for this outbox arrives or until
// deadline, then drops the notifications already received: the next
// round sees every row they announce.
func (r *Relay) wait(ctx context.Context, s *session, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		n, err := s.conn.WaitForNotification(wctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if wctx.Err() != nil {
				return nil // poll
			}
			return fmt.Errorf("wait for notifications: %w", err)
		}
		if n.Payload == s.schema || n.Payload == "" {
			break
		}
	}
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	for {
		if n, _ := s.conn.WaitForNotification(done); n == nil {
			return nil
		}
	}
}

// memberSQL counts the relays on this outbox (holders of the shared
// membership lock) with this shard count and with another one.
const memberSQL = `SELECT count(*) FILTER (WHERE objid = $2::int4::oid), count(*) FILTER (WHERE objid <> $2::int4::oid)
	FROM pg_locks
	WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND classid = $1::int4::oid
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// rebalance makes this relay own its fair share of the shards,
// ceil(Shards / relays): above it, it releases shards (it publishes
// nothing while it does: rounds run on this goroutine); below it, it
// tries to lock shards nobody holds, starting at a random one.
//
// While relays with another shard count run, it owns no shard but stays
// a member, so that those relays see it and own none either: two shard
// counts would split one aggregate's rows between two relays. Had it left
// instead, they would take the shards in its absence and the two sides
// would take turns.
func (r *Relay) rebalance(ctx context.Context, s *session) error {
	var same, other int
	if err := s.conn.QueryRow(ctx, memberSQL, s.memberNS, r.cfg.Shards).Scan(&same, &other); err != nil {
		return fmt.Errorf("count relays: %w", err)
	}
	if mismatch := other > 0; mismatch != s.mismatch {
		s.mismatch = mismatch
		if mismatch {
			r.log.Error("outbox relay: relays with another shard count run on this outbox; all replicas must use the same --shards, or per-aggregate order is lost: publishing stops until they agree",
				"other_relays", other, "shards", r.cfg.Shards)
		} else {
			r.log.Info("outbox relay: no relay with another shard count is left; publishing resumes")
		}
	}
	fair := (r.cfg.Shards + max(same, 1) - 1) / max(same, 1)
	if s.mismatch {
		fair = 0
	}
	before := s.count
	for shard := r.cfg.Shards - 1; shard >= 0 && s.count > fair; shard-- {
		if !s.owned[shard] {
			continue
		}
		if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, s.shardNS, shard); err != nil {
			return fmt.Errorf("release shard %d: %w", shard, err)
		}
		s.owned[shard] = false
		s.count--
	}
	start := rand.IntN(r.cfg.Shards)
	for i := 0; i < r.cfg.Shards && s.count < fair; i++ {
		shard := (start + i) % r.cfg.Shards
		if s.owned[shard] {
			continue
		}
		var got bool
		if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, s.shardNS, shard).Scan(&got); err != nil {
			return fmt.Errorf("lock shard %d: %w", shard, err)
		}
		if got {
			s.owned[shard] = true
			s.count++
		}
	}
	if s.count != before {
		r.m.owned.Add(float64(s.count - before))
		r.log.Info("outbox relay: shards rebalanced", "relays", same, "fair_share", fair, "owned", s.list())
	}
	return nil
}

// fatalError ends the session: its connection may be gone, and with it
// the shard locks.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// claimColumns are what a claim reads of a row o.
const claimColumns = `o.seq, o.id, o.aggregate_id, o.version, o.event_type, o.topic, o.payload, o.value,
		o.tenant, o.source, o.subject, o.event_time, o.traceparent, o.tracestate,
		extract(epoch FROM clock_timestamp() - o.created_at)::float8`

// claimable is the condition on a row o a claim returns: unpublished, and
// not behind a row of its aggregate blocked by an unencodable value.
const claimable = `o.published_at IS NULL AND o.error IS NULL
	  AND NOT EXISTS (SELECT 1 FROM projector_outbox b
		WHERE b.published_at IS NULL AND b.error IS NOT NULL
		  AND b.topic = o.topic AND b.aggregate_id = o.aggregate_id AND b.seq < o.seq)`

// maxMergedShards is the most owned shards a claim reads one by one; a
// relay owning more claims in one walk of the seq index.
const maxMergedShards = 64

// claimSQL returns the claim of a relay owning owned of shards shards:
// the next rows of the owned shards in seq order, at most the limit. It
// takes no row locks: only the owner of a shard reads its rows.
//
// With the shard index built, each owned shard's rows are read from it in
// seq order and merged (a Merge Append under the limit), so that a claim
// reads about as many rows as it returns however far other shards lag;
// the shard numbers are $1…$n and the limit $n+1. Without it, the claim
// walks the unpublished rows of every shard in seq order and keeps its
// own: $1 the shard count, $2 the owned shards, $3 the limit.
func claimSQL(shards, owned int, indexed bool) string {
	if !indexed || owned > maxMergedShards {
		return `SELECT ` + claimColumns + `
	FROM projector_outbox o
	WHERE ` + claimable + `
	  AND ((hashtextextended(o.aggregate_id, 0) % $1) + $1) % $1 = ANY($2::bigint[])
	ORDER BY o.seq
	LIMIT $3`
	}
	var b strings.Builder
	b.WriteString("SELECT * FROM (")
	for i := range owned {
		if i > 0 {
			b.WriteString("\n\tUNION ALL ")
		}
		fmt.Fprintf(&b, "(SELECT %s\n\tFROM projector_outbox o WHERE %s = $%d::bigint AND %s\n\tORDER BY o.seq LIMIT $%d)",
			claimColumns, shardExpr("o", shards), i+1, claimable, owned+1)
	}
	fmt.Fprintf(&b, ") c ORDER BY 1 LIMIT $%d", owned+1)
	return b.String()
}

// claimArgs are the arguments of claimSQL(shards, len(owned), indexed).
func claimArgs(shards int, owned []int64, limit int, indexed bool) []any {
	if !indexed || len(owned) > maxMergedShards {
		return []any{int64(shards), owned, limit}
	}
	args := make([]any, 0, len(owned)+1)
	for _, o := range owned {
		args = append(args, o)
	}
	return append(args, limit)
}

const markSQL = `UPDATE projector_outbox SET published_at = clock_timestamp() WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`

const blockSQL = `UPDATE projector_outbox SET error = $2, failed_at = clock_timestamp() WHERE seq = $1`

type aggKey struct{ topic, id string }

// round claims a batch of the owned shards' rows (one statement, so one
// short transaction), produces it, waits for the broker's
// acknowledgements and marks the acknowledged rows published (another
// statement). Per aggregate only the acknowledged prefix is marked. It
// returns how many rows it claimed; a *fatalError ends the session.
func (r *Relay) round(ctx context.Context, s *session) (int, error) {
	claimedAt := time.Now()
	owned, indexed := s.list(), r.indexed.Load()
	rows, err := s.conn.Query(ctx, claimSQL(r.cfg.Shards, len(owned), indexed), claimArgs(r.cfg.Shards, owned, r.cfg.BatchSize, indexed)...)
	if err != nil {
		return 0, &fatalError{fmt.Errorf("claim: %w", err)}
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*claimed, error) {
		c := &claimed{}
		return c, row.Scan(&c.seq, &c.id, &c.aggID, &c.version, &c.typ, &c.topic, &c.payload, &c.value,
			&c.tenant, &c.source, &c.subject, &c.at, &c.traceparent, &c.tracestate, &c.age)
	})
	if err != nil {
		return 0, &fatalError{fmt.Errorf("claim: %w", err)}
	}
	if len(batch) == 0 {
		return 0, nil
	}

	// Build the records; a row that cannot be encoded holds back its
	// aggregate, and so does a registry failure for its topic.
	var (
		held       = map[aggKey]bool{}
		badTopics  = map[string]error{}
		recs       = make([]*kgo.Record, 0, len(batch))
		sent       = make([]*claimed, 0, len(batch))
		softErr    error
		registryOK = true
	)
	for _, c := range batch {
		k := aggKey{c.topic, c.aggID}
		if held[k] {
			continue
		}
		v := c.payload
		if c.value != nil {
			if err := badTopics[c.topic]; err != nil {
				held[k] = true
				continue
			}
			v, err = r.schemas.encode(ctx, c.topic, c.value)
			if err != nil {
				held[k] = true
				if !errors.Is(err, errUnencodable) {
					badTopics[c.topic], softErr, registryOK = err, err, false
					continue
				}
				r.log.Error("outbox relay: event cannot be encoded; its aggregate's later events wait until it is retried",
					"seq", c.seq, "id", c.id, "topic", c.topic, "aggregate_id", c.aggID, "version", c.version, "err", err)
				if _, err := s.conn.Exec(ctx, blockSQL, c.seq, err.Error()); err != nil {
					return len(batch), &fatalError{fmt.Errorf("block row %d: %w", c.seq, err)}
				}
				continue
			}
		}
		recs = append(recs, c.record(v))
		sent = append(sent, c)
	}

	errs, lost := r.produce(ctx, s, recs, sent, claimedAt)
	if lost != nil {
		return len(batch), &fatalError{lost}
	}

	// Mark the acknowledged prefix of each aggregate. franz-go fails every
	// later record of a partition after a failed one, so this is every
	// acknowledged record in practice.
	var (
		broken  = map[aggKey]bool{}
		done    = make([]int64, 0, len(sent))
		refused []int // first failed record of an aggregate, refused for good
		retry   error // a failure that may pass on its own
	)
	for i, c := range sent {
		k := aggKey{c.topic, c.aggID}
		if errs[i] == nil && !broken[k] {
			done = append(done, c.seq)
			continue
		}
		if errs[i] != nil && !broken[k] {
			if refusedForGood(errs[i]) {
				refused = append(refused, i)
			} else if retry == nil {
				retry = fmt.Errorf("produce %s %s v%d (seq %d): %w", c.topic, c.aggID, c.version, c.seq, errs[i])
			}
		}
		broken[k] = true
	}
	if len(done) > 0 {
		// The records are out: mark them even if ctx ended meanwhile.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err := s.conn.Exec(mctx, markSQL, done)
		cancel()
		if err != nil {
			return len(batch), &fatalError{fmt.Errorf("%d events published, but marking them failed (they will be published again): %w", len(done), err)}
		}
	}
	for _, i := range refused {
		c := sent[i]
		r.log.Error("outbox relay: the broker refused an event; its aggregate's later events wait until it is retried",
			"seq", c.seq, "id", c.id, "topic", c.topic, "aggregate_id", c.aggID, "version", c.version, "err", errs[i])
		if _, err := s.conn.Exec(ctx, blockSQL, c.seq, "produce: "+errs[i].Error()); err != nil {
			return len(batch), &fatalError{fmt.Errorf("block row %d: %w", c.seq, err)}
		}
	}
	if retry != nil {
		return len(batch), fmt.Errorf("%d of %d records not acknowledged: %w", len(sent)-len(done), len(sent), retry)
	}
	if !registryOK {
		return len(batch), fmt.Errorf("schema registry: %w", softErr)
	}
	r.log.Debug("outbox relay: published", "events", len(done), "claimed", len(batch))
	return len(batch), nil
}

// produce produces recs and waits for every acknowledgement. Meanwhile
// it watches the session, so that a relay whose session ends (and with it
// its shard locks) stops producing at once: the records not yet sent are
// withdrawn (franz-go fails them, once no request of theirs is on the
// wire), and the next owner of the shards publishes them. It returns
// each record's error, or why the session was lost, and reports records
// that wait longer than UnreadyAfter.
func (r *Relay) produce(ctx context.Context, s *session, recs []*kgo.Record, sent []*claimed, claimedAt time.Time) ([]error, error) {
	errs := make([]error, len(recs))
	if len(recs) == 0 {
		return errs, nil
	}
	pctx, withdraw := context.WithCancel(ctx)
	defer withdraw()
	// The watcher is the only user of the connection until it returns.
	wctx, stopWatching := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- r.watch(wctx, s) }()
	watching := true
	defer func() {
		stopWatching()
		if watching {
			<-watched
		}
	}()

	var (
		left     atomic.Int64
		lastAck  atomic.Int64 // unix nanoseconds
		acked    atomic.Int64
		finished = make(chan struct{})
	)
	left.Store(int64(len(recs)))
	lastAck.Store(time.Now().UnixNano())
	for i, rec := range recs {
		c := sent[i]
		r.cfg.Client.Produce(pctx, rec, func(_ *kgo.Record, err error) {
			errs[i] = err
			if err == nil {
				acked.Add(1)
				lastAck.Store(time.Now().UnixNano())
				r.m.published.WithLabelValues(c.topic).Inc()
				r.m.duration.Observe(c.age + time.Since(claimedAt).Seconds())
			} else if !errors.Is(err, context.Canceled) {
				r.m.failures.Inc() // not withdrawn: the client gave up
			}
			if left.Add(-1) == 0 {
				close(finished)
			}
		})
	}

	check := min(max(r.cfg.UnreadyAfter/5, 10*time.Millisecond), time.Second)
	tick := time.NewTicker(check)
	defer tick.Stop()
	var lost error
	for {
		select {
		case <-finished:
			if acked.Load() > 0 {
				r.stall.clear(r)
			}
			return errs, lost
		case err := <-watched:
			watching, watched = false, nil // a nil channel is never ready
			if err != nil {
				lost = fmt.Errorf("session lost with %d of %d records unacknowledged; they are withdrawn and its shards' next owner publishes them: %w",
					left.Load(), len(recs), err)
				withdraw()
			}
		case <-tick.C:
			waited := time.Since(time.Unix(0, lastAck.Load()))
			switch {
			case waited >= r.cfg.UnreadyAfter:
				r.stall.set(r, int(left.Load()), waited)
			case acked.Load() > 0:
				r.stall.clear(r)
			}
		}
	}
}

// watch waits on the session's connection while records are in flight,
// until ctx ends (nil) or the connection fails (its error). The
// notifications it reads are remembered, so that the next round starts
// at once.
func (r *Relay) watch(ctx context.Context, s *session) error {
	for {
		n, err := s.conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n.Payload == s.schema || n.Payload == "" {
			s.notified = true
		}
	}
}

// stall is whether the relay's records have waited longer than
// UnreadyAfter for the broker: Ready reports it, and it is logged when it
// starts, once a minute while it lasts, and when it ends.
type stall struct {
	mu      sync.Mutex
	since   time.Time // zero: not stalled
	logged  time.Time
	records int
	waited  time.Duration
}

// stallLogEvery is how often a stall that lasts is logged again.
const stallLogEvery = time.Minute

func (st *stall) set(r *Relay, records int, waited time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	st.records, st.waited = records, waited
	if st.since.IsZero() {
		st.since = now.Add(-waited)
		r.m.stalled.Set(1)
	} else if now.Sub(st.logged) < stallLogEvery {
		return
	}
	st.logged = now
	r.log.Warn("outbox relay: records wait for the broker's acknowledgement; the broker is unreachable or refuses produce requests (the Kafka client's own warnings say which)",
		"records", records, "waited", waited.Round(time.Millisecond), "stalled_for", now.Sub(st.since).Round(time.Millisecond))
}

// clear ends a stall: the broker acknowledged records.
func (st *stall) clear(r *Relay) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.since.IsZero() {
		return
	}
	r.log.Info("outbox relay: the broker acknowledges records again", "stalled_for", time.Since(st.since).Round(time.Millisecond))
	st.since = time.Time{}
	r.m.stalled.Set(0)
}

// reset ends a stall without a word: the session ended, and with it the
// relay's waiting records.
func (st *stall) reset(r *Relay) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.since = time.Time{}
	r.m.stalled.Set(0)
}

func (st *stall) err() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.since.IsZero() {
		return nil
	}
	return fmt.Errorf("%d records unacknowledged for %s: the broker is unreachable or refuses produce requests", st.records, st.waited.Round(time.Millisecond))
}

// refusedForGood tells a produce error retrying cannot fix (a record too
// large, a topic that does not exist or may not be written) from one that
// may pass (the broker unavailable, a timeout, shutting down).
func refusedForGood(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, kgo.ErrRecordRetries) ||
		errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, kgo.ErrMaxBuffered) || errors.Is(err, kgo.ErrAborting) {
		return false
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return !ke.Retriable || ke == kerr.UnknownTopicOrPartition || ke == kerr.UnknownTopicID
	}
	return false
}

// buildShardIndex makes sure the claim index of the relay's shard count
// exists, building it without blocking writers when it does not, and
// retrying every CleanupInterval until it is built; claims use it from
// then on.
func (r *Relay) buildShardIndex(ctx context.Context) {
	for {
		start := time.Now()
		ready, err := ensureShardIndex(ctx, r.pool, r.cfg.Shards, func() {
			r.log.Info("outbox relay: building the claim index of this shard count (CREATE INDEX CONCURRENTLY); until it is built, claims read every shard's backlog",
				"index", shardIndexName(r.cfg.Shards))
		})
		if ready {
			if time.Since(start) > time.Second {
				r.log.Info("outbox relay: claim index ready", "index", shardIndexName(r.cfg.Shards), "took", time.Since(start).Round(time.Millisecond))
			}
			r.indexed.Store(true)
			return
		}
		if ctx.Err() != nil {
			return
		}
		retry := r.cfg.PollInterval // another relay is building it
		if !errors.Is(err, errIndexBusy) {
			retry = r.cfg.CleanupInterval
			r.log.Warn("outbox relay: the claim index of this shard count could not be built; claims read every shard's backlog until it is; retried",
				"index", shardIndexName(r.cfg.Shards), "err", err, "retry_in", retry)
		}
		if !sleep(ctx, retry) {
			return
		}
	}
}

// housekeeping refreshes the backlog gauges every PollInterval and, every
// CleanupInterval, deletes published rows past Retention and retries
// blocked rows.
func (r *Relay) housekeeping(ctx context.Context) {
	gauges := time.NewTicker(r.cfg.PollInterval)
	defer gauges.Stop()
	cleanup := time.NewTicker(r.cfg.CleanupInterval)
	defer cleanup.Stop()
	r.refreshGauges(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-gauges.C:
			r.refreshGauges(ctx)
		case <-cleanup.C:
			if n, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox relay: cleanup failed", "err", err)
			} else if n > 0 {
				r.log.Info("outbox relay: deleted published events past retention", "events", n, "retention", r.cfg.Retention)
			}
		}
	}
}

func (r *Relay) refreshGauges(ctx context.Context) {
	var (
		pending, blocked int64
		oldest           float64
	)
	err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE error IS NOT NULL),
			coalesce(extract(epoch FROM clock_timestamp() - min(created_at))::float8, 0)
		FROM projector_outbox WHERE published_at IS NULL`).Scan(&pending, &blocked, &oldest)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Debug("outbox relay: backlog gauges", "err", err)
		}
		return
	}
	r.m.pending.Set(float64(pending))
	r.m.blocked.Set(float64(blocked))
	r.m.oldest.Set(max(oldest, 0))
}

// Cleanup deletes published rows older than Retention, at most 10,000 per
// statement, and makes rows blocked for longer than CleanupInterval
// claimable again (a schema registered since may fit them). It returns how
// many rows it deleted. Run calls it every CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	if _, err := r.pool.Exec(ctx, `UPDATE projector_outbox SET error = NULL, failed_at = NULL
		WHERE published_at IS NULL AND error IS NOT NULL AND failed_at < clock_timestamp() - $1::interval`, r.cfg.CleanupInterval); err != nil {
		return 0, fmt.Errorf("retry blocked rows: %w", err)
	}
	if r.cfg.Retention < 0 {
		return 0, nil
	}
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, `DELETE FROM projector_outbox WHERE seq IN (
			SELECT seq FROM projector_outbox WHERE published_at < clock_timestamp() - $1::interval
			ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, r.cfg.Retention, deleteBatch)
		if err != nil {
			return total, fmt.Errorf("delete published rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < deleteBatch {
			return total, nil
		}
	}
}

// ShardOwners returns which Postgres backend (pid) holds each shard lock
// of the outbox pool's search_path finds; shards nobody holds are absent.
func ShardOwners(ctx context.Context, pool *pgxpool.Pool) (map[int]int32, error) {
	rows, err := pool.Query(ctx, `SELECT l.objid::int4, l.pid FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.mode = 'ExclusiveLock'
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid = (SELECT hashtext('projector_outbox.shard:' || 'projector_outbox'::regclass::oid))::oid`)
	if err != nil {
		return nil, fmt.Errorf("outbox: shard owners: %w", err)
	}
	out := map[int]int32{}
	var shard, pid int32
	_, err = pgx.ForEachRow(rows, []any{&shard, &pid}, func() error {
		out[int(shard)] = pid
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: shard owners: %w", err)
	}
	return out, nil
}

// retryDelay is the delay before retry attempt n (0-based), with the
// backoff every retry of projector uses.
func (r *Relay) retryDelay(n int) time.Duration {
	return backoff.Policy{Base: r.cfg.RetryBase, Cap: r.cfg.RetryCap}.Delay(n)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
