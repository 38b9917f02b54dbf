package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/repair"
)

// Defaults of the flags that shape a member's PostgreSQL sessions.
const (
	// DefaultDatabaseMaxConns is the size of a member's pool: a partition
	// worker uses one connection to commit and one to read ahead, so ten
	// serve five busy partitions at once, and eight members leave room for
	// other clients within PostgreSQL's default max_connections of 100.
	DefaultDatabaseMaxConns = 10
	// DefaultDatabaseLockTimeout bounds a statement's wait for a lock, such
	// as a new owner's claim of a partition whose old owner still holds the
	// offset row: it fails and is retried instead of hanging.
	DefaultDatabaseLockTimeout = 5 * time.Second
	// DefaultDatabaseIdleInTxTimeout ends the session of a member that
	// stopped in the middle of a transaction (a stopped process, a long
	// pause, a network stall), releasing its locks. The engine's own
	// transactions are idle only while it plans a batch.
	DefaultDatabaseIdleInTxTimeout = 15 * time.Second
	// DefaultDatabaseMaxConnLifetime is how long a pooled session lives
	// before it is closed and opened afresh (plus up to a fifth of it at
	// random, so that the pool's sessions do not all reconnect at once): a
	// session keeps the settings it began with, and changes made with
	// ALTER ROLE or ALTER DATABASE ... SET reach it only when it is
	// replaced.
	DefaultDatabaseMaxConnLifetime = 30 * time.Minute
	// DefaultStartupTimeout bounds the database work a command retries
	// when it starts (connecting, checking, migrating).
	DefaultStartupTimeout = 2 * time.Minute
)

// applicationName names projector's sessions in pg_stat_activity unless
// --database-url names them otherwise.
const applicationName = "projector"

// perAttempt bounds one attempt to connect, so that an address that drops
// packets costs a retry, not the whole startup timeout.
const perAttempt = 5 * time.Second

// dbFlags are the flags of a command that keeps a pool of PostgreSQL
// sessions and retries its startup.
type dbFlags struct {
	fs             *flag.FlagSet
	maxConns       int
	maxLifetime    time.Duration
	lockTimeout    time.Duration
	idleInTx       time.Duration
	startupTimeout time.Duration
	pooler         string
	// settings are the session settings of the last poolConfig that are
	// not startup parameters a pooler passes on, by name.
	settings map[string]string
}

func (d *dbFlags) register(fs *flag.FlagSet, which ...string) {
	d.fs = fs
	for _, w := range which {
		switch w {
		case "pool":
			fs.IntVar(&d.maxConns, "database-max-conns", DefaultDatabaseMaxConns, "most PostgreSQL connections this member opens; keep members × this + headroom for other clients within max_connections; a pool_max_conns in --database-url applies unless this flag is set")
			fs.DurationVar(&d.maxLifetime, "database-max-conn-lifetime", DefaultDatabaseMaxConnLifetime, "how long a PostgreSQL session lives before it is replaced (plus up to a fifth more at random), so that settings changed with ALTER ROLE or ALTER DATABASE ... SET reach every session within it; a pool_max_conn_lifetime in --database-url applies unless this flag is set")
		case "sessions":
			fs.DurationVar(&d.lockTimeout, "database-lock-timeout", DefaultDatabaseLockTimeout, "longest a statement waits for a lock before it fails and is retried; PostgreSQL's lock_timeout; 0: the server's setting")
			fs.DurationVar(&d.idleInTx, "database-idle-in-transaction-timeout", DefaultDatabaseIdleInTxTimeout, "PostgreSQL ends a session idle this long inside a transaction, so a frozen member's locks do not hold up the partitions' new owners; PostgreSQL's idle_in_transaction_session_timeout; 0: the server's setting")
		case "pooler":
			fs.StringVar(&d.pooler, "database-pooler", poolerNone, "what --database-url leads to: none (PostgreSQL), session or transaction (a PgBouncer pool of that pool_mode); behind a pooler the session settings are applied after connecting, and behind transaction pooling statements are not prepared by name")
		case "startup":
			fs.DurationVar(&d.startupTimeout, "startup-timeout", DefaultStartupTimeout, "how long startup retries connecting to and migrating PostgreSQL while it is unreachable, restarting or failing over")
		}
	}
}

func (d *dbFlags) validate() error {
	if d.fs.Lookup("database-max-conns") != nil && d.maxConns < 1 {
		return fmt.Errorf("--database-max-conns %d: must be at least 1", d.maxConns)
	}
	if d.fs.Lookup("database-max-conn-lifetime") != nil && d.maxLifetime < time.Second {
		return fmt.Errorf("--database-max-conn-lifetime %s: must be at least 1s", d.maxLifetime)
	}
	if d.lockTimeout < 0 {
		return fmt.Errorf("--database-lock-timeout %s: must be 0 (the server's setting) or positive", d.lockTimeout)
	}
	if d.idleInTx != 0 && d.idleInTx < time.Second {
		return fmt.Errorf("--database-idle-in-transaction-timeout %s: must be 0 (the server's setting) or at least 1s: a transaction is idle while its batch is planned", d.idleInTx)
	}
	if d.fs.Lookup("database-pooler") != nil && !slices.Contains(poolerModes, d.pooler) {
		return fmt.Errorf("--database-pooler %q: want %s", d.pooler, strings.Join(poolerModes, ", "))
	}
	if d.fs.Lookup("startup-timeout") != nil && d.startupTimeout <= 0 {
		return fmt.Errorf("--startup-timeout %s: must be positive", d.startupTimeout)
	}
	return nil
}

// set reports whether the flag was given, on the command line or in the
// environment.
func (d *dbFlags) set(name string) bool {
	found := false
	d.fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// poolConfig parses --database-url and applies the session flags: a flag
// given explicitly wins over the URL's parameter, which wins over the
// flag's default.
func (d *dbFlags) poolConfig(src dbSource) (*pgxpool.Config, error) {
	raw := src.url
	cfg, err := parseDatabaseURL(src)
	if err != nil {
		return nil, err
	}
	if d.fs.Lookup("database-max-conns") != nil {
		if _, inURL := written(raw)["pool_max_conns"]; !inURL || d.set("database-max-conns") {
			cfg.MaxConns = int32(d.maxConns)
		}
	}
	if d.fs.Lookup("database-max-conn-lifetime") != nil {
		if _, inURL := written(raw)["pool_max_conn_lifetime"]; !inURL || d.set("database-max-conn-lifetime") {
			cfg.MaxConnLifetime = d.maxLifetime
			if _, inURL := written(raw)["pool_max_conn_lifetime_jitter"]; !inURL {
				cfg.MaxConnLifetimeJitter = d.maxLifetime / 5
			}
		}
	}
	params := cfg.ConnConfig.RuntimeParams
	for name, v := range map[string]struct {
		flag string
		d    time.Duration
	}{
		"lock_timeout":                        {"database-lock-timeout", d.lockTimeout},
		"idle_in_transaction_session_timeout": {"database-idle-in-transaction-timeout", d.idleInTx},
	} {
		if d.fs.Lookup(v.flag) == nil {
			continue
		}
		if _, inURL := params[name]; inURL && !d.set(v.flag) {
			continue
		}
		if v.d == 0 {
			delete(params, name)
			continue
		}
		params[name] = strconv.FormatInt(v.d.Milliseconds(), 10) + "ms"
	}
	if d.fs.Lookup("database-pooler") != nil {
		if err := d.forPooler(raw, cfg); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// dbSource is where a command's PostgreSQL sessions connect:
// --database-url, and the file of --database-password-file when given.
type dbSource struct {
	url          string
	passwordFile string
}

// database is the dbSource of the command's flags.
func (c *common) database() dbSource {
	return dbSource{url: c.databaseURL, passwordFile: c.databasePasswordFile}
}

// parseDatabaseURL parses a PostgreSQL URL (or key=value string) and
// refuses one that names no database: pgx would pick one named after the
// user, and the tables would land where nobody looks for them.
func parseDatabaseURL(src dbSource) (*pgxpool.Config, error) {
	raw := src.url
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	w := written(raw)
	if cmp.Or(w["dbname"], w["database"], os.Getenv("PGDATABASE")) == "" {
		return nil, fmt.Errorf("--database-url (PROJECTOR_DATABASE_URL) names no database: write one after the host, e.g. %s", DefaultDatabaseURL)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	}
	if src.passwordFile != "" {
		if _, inURL := w["password"]; inURL {
			return nil, errors.New("both a password in --database-url (PROJECTOR_DATABASE_URL) and --database-password-file (PROJECTOR_DATABASE_PASSWORD_FILE) are given: give one, the file to have a rotated password used by new sessions")
		}
		if err := passwordFromFile(cfg, secretFile{flag: "--database-password-file", path: src.passwordFile}); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// passwordFromFile has every new session of cfg's pool log in with the
// password in file, read as the session is opened: a Kubernetes secret
// rotated in place reaches the sessions opened after it, while those open
// keep theirs (--database-max-conn-lifetime bounds how long).
func passwordFromFile(cfg *pgxpool.Config, file secretFile) error {
	pw, err := file.read()
	if err != nil {
		return err
	}
	cfg.ConnConfig.Password = pw
	before := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if before != nil {
			if err := before(ctx, cc); err != nil {
				return err
			}
		}
		pw, err := file.read()
		if err != nil {
			return err
		}
		cc.Password = pw
		return nil
	}
	return nil
}

// keywordRe matches a key=value pair of a connection string.
var keywordRe = regexp.MustCompile(`([a-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)`)

// written returns the settings the user wrote in a database URL, the
// database under "dbname", without the defaults pgx fills in.
func written(raw string) map[string]string {
	out := map[string]string{}
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		u, err := url.Parse(raw)
		if err != nil {
			return out
		}
		for k, vs := range u.Query() {
			out[k] = vs[len(vs)-1]
		}
		if db := strings.TrimPrefix(u.Path, "/"); db != "" {
			out["dbname"] = db
		}
		if pw, ok := u.User.Password(); ok {
			out["password"] = pw
		}
		return out
	}
	for _, m := range keywordRe.FindAllStringSubmatch(raw, -1) {
		out[m[1]] = strings.Trim(m[2], "'")
	}
	return out
}

// dbTarget is where a pool's sessions write. It never holds the password.
type dbTarget struct {
	Host     string
	Port     uint16
	Database string
	Schema   string // the first schema of search_path that exists
	User     string
}

func targetOf(cfg *pgxpool.Config) dbTarget {
	c := cfg.ConnConfig
	return dbTarget{Host: c.Host, Port: c.Port, Database: c.Database, Schema: c.RuntimeParams["search_path"], User: c.User}
}

func (t dbTarget) String() string {
	s := fmt.Sprintf("host %s port %d database %q", t.Host, t.Port, t.Database)
	if t.Schema != "" {
		s += fmt.Sprintf(" schema %q", t.Schema)
	}
	return s + fmt.Sprintf(" user %q", t.User)
}

// attrs are the target as log attributes.
func (t dbTarget) attrs() []any {
	return []any{"host", t.Host, "port", t.Port, "database", t.Database, "schema", t.Schema, "user", t.User}
}

// slots is what the server allows in connections and what is in use.
type slots struct {
	max, reserved, inUse int
	superuser            bool
}

// allowed is the most connections the user may hold.
func (s slots) allowed() int {
	if s.superuser {
		return s.max
	}
	return s.max - s.reserved
}

// registerRetry registers --retry-base and --retry-cap, the one backoff of
// every retry a command makes (partitions, claims, gap repair, startup,
// the outbox relay).
func registerRetry(fs *flag.FlagSet, base, ceiling *time.Duration) {
	fs.DurationVar(base, "retry-base", defaultRetryBase, "base of the exponential backoff after a transient failure")
	fs.DurationVar(ceiling, "retry-cap", defaultRetryCap, "cap of the exponential backoff; each delay is random in [0, min(cap, base·2^attempt)]")
}

// validateRetry checks the values of --retry-base and --retry-cap.
func validateRetry(base, ceiling time.Duration) error {
	if base <= 0 || ceiling < base {
		return fmt.Errorf("--retry-base %s, --retry-cap %s: want 0 < base <= cap", base, ceiling)
	}
	return nil
}

// startup runs a command's first database work: it retries what fails
// for a reason that passes (the server unreachable, restarting, failing
// over, out of connection slots) with exponential backoff and full jitter,
// until the startup timeout.
type startup struct {
	log       *slog.Logger // attempts that fail are logged here; nil: not logged
	timeout   time.Duration
	base, cap time.Duration
	// failed, when set, hears of each failed attempt, for /readyz.
	failed func(step string, err error)
}

// starting is what a command's startup is doing, or last failed at, for
// /readyz to show until the engine or relay it starts answers instead.
type starting struct{ err atomic.Pointer[error] }

// step says startup is now at what.
func (s *starting) step(what string) {
	err := errors.New("starting: " + what)
	s.err.Store(&err)
}

// ready is /readyz's checks: svc's once it is running (nil before).
func (s *starting) ready(ctx context.Context, svc func() readiness) map[string]error {
	if r := svc(); r != nil {
		return r.Ready(ctx)
	}
	return map[string]error{"startup": *s.err.Load()}
}

// readiness is what /readyz asks of a running engine or relay.
type readiness interface {
	Ready(ctx context.Context) map[string]error
}

// newStartup is the startup of a command serving /readyz: each failed
// attempt is counted in projector_startup_retries_total{step}, registered
// with reg, and shown by st.
func newStartup(log *slog.Logger, reg prometheus.Registerer, timeout, base, cap time.Duration, st *starting) startup {
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "projector_startup_retries_total",
		Help: "Attempts of startup's database work (step: connect, migrate) that failed and were retried.",
	}, []string{"step"})
	reg.MustRegister(retries)
	for _, step := range []string{"connect", "check", "migrate"} {
		retries.WithLabelValues(step) // at 0 from the start, for rate()
	}
	return startup{log: log, timeout: timeout, base: base, cap: cap,
		failed: func(what string, err error) {
			retries.WithLabelValues(what).Inc()
			err = fmt.Errorf("starting: %s failed, retrying: %w", what, err)
			st.err.Store(&err)
		}}
}

// errStartupTimeout marks a startup that gave up after its timeout.
var errStartupTimeout = errors.New("gave up after --startup-timeout")

// do runs step until it succeeds, fails for good, or ctx (which bounds the
// whole startup) ends.
func (s startup) do(ctx context.Context, step string, fn func(context.Context) error) error {
	var last error // of the last attempt that ran its course
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if s.timeout <= 0 || !transientDB(err) {
			return err
		}
		if ctx.Err() != nil {
			// An attempt cut short by the deadline says less than the
			// one before it.
			return s.gaveUp(ctx, attempt, cmp.Or(last, err))
		}
		last = err
		delay := backoff.Policy{Base: s.base, Cap: s.cap}.Delay(attempt - 1)
		if s.log != nil {
			s.log.Warn("PostgreSQL not ready at startup; retrying", "step", step, "attempt", attempt, "delay", delay, "err", err)
		}
		if s.failed != nil {
			s.failed(step, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return s.gaveUp(ctx, attempt, err)
		case <-t.C:
		}
	}
}

func (s startup) gaveUp(ctx context.Context, attempts int, err error) error {
	if errors.Is(context.Cause(ctx), errStartupTimeout) {
		return fmt.Errorf("%w %s (%d attempts): %w", errStartupTimeout, s.timeout, attempts, err)
	}
	return err
}

// bound returns ctx bounded by the startup timeout.
func (s startup) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, s.timeout, errStartupTimeout)
}

// transientDB reports whether a failed database call may succeed when
// tried again: the connection failed or was ended, the server is
// starting, stopping or out of connection slots, or a lock was not
// granted in time.
func transientDB(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "55P03" { // lock_not_available
		return true
	}
	if _, refused := unsupportedParameter(err); refused {
		return false // a pooler's configuration, which no retry changes
	}
	return repair.IsTransient(err)
}

// openDatabase opens a pool on cfg and checks that PostgreSQL answers,
// retrying within ctx as s says; it returns where the pool writes. With
// checkSlots, it refuses a pool larger than the server allows and warns
// when the server has fewer free connection slots than the pool may take.
func openDatabase(ctx context.Context, cfg *pgxpool.Config, s startup, checkSlots bool) (*pgxpool.Pool, dbTarget, error) {
	target := targetOf(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, target, fmt.Errorf("--database-url: %w", err)
	}
	var sl slots
	err = s.do(ctx, "connect", func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, perAttempt)
		defer cancel()
		var schema *string
		// The simple protocol prepares no statement by name, which
		// fails behind a transaction pool that --database-pooler does
		// not name before the pooler check can say so.
		err := pool.QueryRow(actx, `SELECT current_database(), current_schema(), current_user,
			current_setting('max_connections')::int,
			current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0),
			(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
			coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)`, pgx.QueryExecModeSimpleProtocol).
			Scan(&target.Database, &schema, &target.User, &sl.max, &sl.reserved, &sl.inUse, &sl.superuser)
		if err != nil {
			return err
		}
		if schema == nil {
			return fmt.Errorf("--database-url: search_path %q names no schema that exists in database %q: create it, or set search_path to one that does",
				cfg.ConnConfig.RuntimeParams["search_path"], target.Database)
		}
		target.Schema = *schema
		return nil
	})
	if err != nil {
		pool.Close()
		return nil, target, explain(target, err)
	}
	if !checkSlots {
		return pool, target, nil
	}
	if err := sl.check(target, int(cfg.MaxConns), int(pool.Stat().TotalConns()), s.log); err != nil {
		pool.Close()
		return nil, target, err
	}
	return pool, target, nil
}

// sizingRule is how to size pools, said wherever they do not fit.
const sizingRule = "keep members × --database-max-conns + headroom for other clients (migrations, psql, monitoring) within max_connections, or raise max_connections"

// check refuses a pool of maxConns that the server can never grant, and
// warns when it has fewer free slots than the pool may yet open (own are
// the pool's connections, already counted in use).
func (sl slots) check(t dbTarget, maxConns, own int, log *slog.Logger) error {
	if maxConns > sl.allowed() {
		return fmt.Errorf("--database-max-conns %d: PostgreSQL at %s:%d allows user %q at most %d connections (max_connections %d, %d reserved for superusers): %s",
			maxConns, t.Host, t.Port, t.User, sl.allowed(), sl.max, sl.reserved, sizingRule)
	}
	free := sl.allowed() - sl.inUse + own
	if log == nil {
		return nil
	}
	if maxConns > free {
		log.Warn("PostgreSQL has fewer free connection slots than this member may open: under load it may be refused with \"too many clients\"",
			"database_max_conns", maxConns, "free_slots", free, "max_connections", sl.max, "reserved_for_superusers", sl.reserved,
			"in_use", sl.inUse, "advice", sizingRule)
		return nil
	}
	log.Info("PostgreSQL connection slots", "database_max_conns", maxConns, "free_slots", free, "max_connections", sl.max, "in_use", sl.inUse)
	return nil
}

// explain says what failed to connect where, and what to do about it.
func explain(t dbTarget, err error) error {
	where := fmt.Sprintf("%s:%d database %q", t.Host, t.Port, t.Database)
	var pg *pgconn.PgError
	if name, ok := unsupportedParameter(err); ok {
		return explainUnsupported(where, name, err)
	}
	if errors.As(err, &pg) {
		switch {
		case pg.Code == "53300": // too_many_connections
			return fmt.Errorf("cannot connect to PostgreSQL at %s: it has no connection slot left (too many clients): %w\n"+
				"Each member opens up to --database-max-conns connections: %s", where, err, sizingRule)
		case pg.Code == "3D000": // invalid_catalog_name
			return fmt.Errorf("cannot connect to PostgreSQL at %s: the database does not exist: %w\n"+
				"Create it, or name another in --database-url (PROJECTOR_DATABASE_URL)", where, err)
		case pg.Code == "28P01" || pg.Code == "28000": // authentication
			return fmt.Errorf("cannot connect to PostgreSQL at %s as user %q: %w\n"+
				"Check the user and password in --database-url (PROJECTOR_DATABASE_URL), or the file of --database-password-file when given", where, t.User, err)
		case pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03" || strings.HasPrefix(pg.Code, "08"):
			return fmt.Errorf("cannot connect to PostgreSQL at %s: the server ended the session or is not accepting sessions (restarting, shutting down or failing over): %w", where, err)
		}
		return fmt.Errorf("PostgreSQL at %s: %w", where, err)
	}
	if !transientDB(err) {
		return err
	}
	return fmt.Errorf("cannot connect to PostgreSQL at %s: %w\n"+
		"Start PostgreSQL, or point --database-url (PROJECTOR_DATABASE_URL) at one, e.g. %s", where, err, DefaultDatabaseURL)
}

// connect opens a pool for a command that runs once (status, dlq, demo):
// one attempt, with a message that says what to do when it fails.
func connect(ctx context.Context, src dbSource) (*pgxpool.Pool, error) {
	return connectWith(ctx, src, nil)
}

// connectWith is connect with edit (if not nil) applied to the parsed
// configuration, for settings a keyword/value connection string cannot be
// given by appending to it.
func connectWith(ctx context.Context, src dbSource, edit func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := parseDatabaseURL(src)
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(cfg)
	}
	pool, _, err := openDatabase(ctx, cfg, startup{}, false)
	return pool, err
}

// The engine's tables that the operator commands read.
const (
	tableOffsets      = "projector_offsets"
	tableOffsetsAudit = "projector_offsets_audit"
	tableDeadLetters  = "projector_dead_letters"
	tableDLQAudit     = "projector_dlq_audit"
	tableRedrives     = "projector_redrives"
)

// engineTables are the tables whose absence, all of them, means that
// projector migrate never ran in a schema.
var engineTables = []string{tableOffsets, tableOffsetsAudit, tableDeadLetters, tableDLQAudit, tableRedrives}

// connectEngine is connect for a command that reads the engine's tables:
// it refuses, saying what to do, a database where they are missing —
// projector migrate never ran there, or the URL points elsewhere — which
// would otherwise surface as PostgreSQL's "relation does not exist".
func connectEngine(ctx context.Context, src dbSource, tables ...string) (*pgxpool.Pool, error) {
	cfg, err := parseDatabaseURL(src)
	if err != nil {
		return nil, err
	}
	pool, target, err := openDatabase(ctx, cfg, startup{}, false)
	if err != nil {
		return nil, err
	}
	var missing []string
	// to_regclass resolves through search_path, as the commands' queries do.
	rows, err := pool.Query(ctx, `SELECT t FROM unnest($1::text[]) t WHERE to_regclass(quote_ident(t)) IS NULL`, engineTables)
	if err == nil {
		missing, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	var lacks []string
	for _, t := range tables {
		if slices.Contains(missing, t) {
			lacks = append(lacks, t)
		}
	}
	switch {
	case err != nil:
		err = fmt.Errorf("PostgreSQL at %s: look up the engine's tables: %w", target, err)
	case len(missing) == len(engineTables):
		err = fmt.Errorf("no projector tables in %s/%s: run projector migrate, or check --database-url", target.Database, target.Schema)
	case len(lacks) > 0:
		err = fmt.Errorf("no table %s in %s/%s: run projector migrate, which creates what this version needs", strings.Join(lacks, ", "), target.Database, target.Schema)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
