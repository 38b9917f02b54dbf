package freshness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/projection"
)

// ErrTooManyWaiters is returned by WaitVersion when Config.MaxWaiters
// requests wait already: the read API answers 429.
var ErrTooManyWaiters = errors.New("too many requests waiting for a version")

// ErrUnknownProjection is returned for a projection the watcher was not
// given.
var ErrUnknownProjection = errors.New("unknown projection")

// Defaults of Config.
const (
	DefaultMaxWaiters = 10000
	DefaultPoll       = 10 * time.Millisecond
	DefaultShare      = 0.02
	// DefaultTolerance is how long after the engine last saw a partition
	// caught up it still counts as caught up: longer than the engine's
	// CaughtUpEvery, so that an idle partition reads as fresh between two
	// of the engine's marks.
	DefaultTolerance = 3 * time.Second
	// DefaultStalenessCache is short beside the staleness a reader acts
	// on (whole seconds past the tolerance), and long beside the time
	// between two reads of a busy API.
	DefaultStalenessCache = 100 * time.Millisecond
)

// Config configures a Watcher.
type Config struct {
	// Identity is the consumer identity whose stored offsets tell the
	// staleness (the engine's Config.Identity).
	Identity string
	// TenantColumns: projection name → the column holding each row's
	// tenant, for projections scoped by tenant.
	TenantColumns map[string]string
	// OtherPartitioner: projection name → true when the producers of its
	// topic choose partitions otherwise than by Kafka's default
	// partitioner over the record key. A key's staleness is then its
	// topic's stalest partition's.
	OtherPartitioner map[string]bool
	// MaxWaiters bounds the requests waiting at once (default
	// DefaultMaxWaiters).
	MaxWaiters int
	// Poll is how often the rows someone waits on are read (default
	// DefaultPoll): the added latency of a read that waits.
	Poll time.Duration
	// Share is the most of the time the watcher spends reading, beyond
	// a tenth of Poll a round (default DefaultShare): a round that
	// reads many keys is followed by a longer pause than Poll, so that
	// the reads of many waiters do not take from the engine the
	// database's time they would otherwise (every key a waiter waits on
	// is an index probe a round). A round that takes no more than a
	// tenth of Poll, a round trip and a few keys, is followed by Poll:
	// a lone read's wait is what it would be without the bound.
	Share float64
	// Tolerance (default DefaultTolerance): see Staleness.
	Tolerance time.Duration
	// StalenessCache is how long one read of a topic's stored offsets
	// answers Staleness (default DefaultStalenessCache); negative: every
	// call reads them.
	StalenessCache time.Duration
	Logger         *slog.Logger
	// Registerer, when set, is given the watcher's metrics.
	Registerer prometheus.Registerer
}

// Result is where an aggregate stood when a wait ended.
type Result struct {
	// Version is the row's version, or the deleted aggregate's last
	// version; 0 when there is neither.
	Version int64
	// Found: the row exists (and is the tenant's, when one was given).
	Found bool
	// Deleted: the aggregate was deleted at Version.
	Deleted bool
	// Reached: Version is at least the version waited for.
	Reached bool
}

// Watcher waits for rows to reach versions, for every request of a
// process at once. Its methods are safe for concurrent use; Run must run
// for waits to end otherwise than by their time limit.
type Watcher struct {
	pool  *pgxpool.Pool
	cfg   Config
	projs map[string]*watched
	kick  chan struct{}

	mu      sync.Mutex
	waiting map[*watched]map[string][]*waiter
	n       int
	failing string // the last poll error logged, "" when the last poll worked

	waits       *prometheus.CounterVec
	gens        atomic.Bool  // the table of generations exists (see generations)
	gensChecked atomic.Int64 // when it was last looked for, in Unix nanoseconds
}

// watched is a projection as the watcher reads it.
type watched struct {
	p      *projection.Projection
	tenant string // the tenant column, "" when not scoped

	once  sync.Mutex
	shape *shape // nil until read from the catalog

	ages   atomic.Pointer[ages] // the last read of its partitions' ages
	agesMu sync.Mutex           // one reader of them at a time
}

// shape is what the watcher learns of a projection's table from the
// catalog, once.
type shape struct {
	textKey     bool   // the key column is text: keys need no cast
	generations bool   // the statement looks up the live generation
	keyType     string // the key column's type, for casts
	poll        string // the statement of a round
	// pollTenant reads keys ($1) of one tenant ($2) only, tombstones
	// left out: the last read of a wait bound to a tenant.
	pollTenant string
}

// waiter is one request waiting.
type waiter struct {
	key    string // as stored (see canonical)
	tenant string
	min    int64
	done   chan Result // buffered: the round never blocks on it
	last   *state      // what the last round saw, nil before one did
}

// state is what a round read of one key.
type state struct {
	version   int64
	found     bool
	deleted   bool
	tenant    string
	hasTenant bool
}

// NewWatcher returns a watcher of projs, reading through pool.
func NewWatcher(pool *pgxpool.Pool, projs []*projection.Projection, cfg Config) (*Watcher, error) {
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Share <= 0 || cfg.Share > 1 {
		cfg.Share = DefaultShare
	}
	if cfg.StalenessCache == 0 {
		cfg.StalenessCache = DefaultStalenessCache
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{pool: pool, cfg: cfg, projs: map[string]*watched{}, kick: make(chan struct{}, 1),
		waiting: map[*watched]map[string][]*waiter{}}
	for _, p := range projs {
		w.projs[p.Name] = &watched{p: p, tenant: cfg.TenantColumns[p.Name]}
	}
	for name := range cfg.TenantColumns {
		if w.projs[name] == nil {
			return nil, fmt.Errorf("freshness: tenant column of projection %q: %w", name, ErrUnknownProjection)
		}
	}
	w.waits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "projector_read_waits_total",
		Help: "Reads that waited for a version, by how the wait ended: reached, timeout, canceled or refused (too many waiting).",
	}, []string{"outcome"})
	for _, o := range []string{"reached", "timeout", "canceled", "refused"} {
		w.waits.WithLabelValues(o)
	}
	if cfg.Registerer != nil {
		waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "projector_read_waiters",
			Help: "Reads waiting for a version now.",
		}, func() float64 { return float64(w.Waiting()) })
		for _, c := range []prometheus.Collector{w.waits, waiting} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("freshness: register metrics: %w", err)
			}
		}
	}
	return w, nil
}

// WaitVersion waits up to wait until the row of key in projection has a
// version of at least min, or the aggregate was deleted at a version of
// at least min. tenant, when not empty, restricts the wait to that
// tenant's rows: another tenant's row is as absent as a missing one, and
// so is a deleted aggregate, whose tombstone does not record its tenant.
// In a projection without a tenant column (Config.TenantColumns), tenant
// restricts nothing.
// When the time is up, Result tells where the aggregate stands
// (Reached false). It returns ErrTooManyWaiters when Config.MaxWaiters
// wait already, and ctx's error when ctx ends first.
func (w *Watcher) WaitVersion(ctx context.Context, projection, key, tenant string, min int64, wait time.Duration) (Result, error) {
	p := w.projs[projection]
	if p == nil {
		return Result{}, fmt.Errorf("wait for %s/%s: %w", projection, key, ErrUnknownProjection)
	}
	if tenant != "" && p.tenant == "" {
		// The projection's rows are no tenant's: whether a token bound
		// to a tenant reads it at all is the caller's decision.
		tenant = ""
	}
	sh, err := w.shapeOf(ctx, p)
	if err != nil {
		return Result{}, err
	}
	stored, ok, err := w.canonical(ctx, sh, key)
	if err != nil {
		return Result{}, fmt.Errorf("wait for %s/%s: %w", projection, key, err)
	}
	if !ok {
		// No row can have this key: it waits for nothing.
		w.waits.WithLabelValues("timeout").Inc()
		return Result{}, nil
	}
	wt := &waiter{key: stored, tenant: tenant, min: min, done: make(chan Result, 1)}
	w.mu.Lock()
	if w.n >= w.cfg.MaxWaiters {
		w.mu.Unlock()
		w.waits.WithLabelValues("refused").Inc()
		return Result{}, ErrTooManyWaiters
	}
	keys := w.waiting[p]
	if keys == nil {
		keys = map[string][]*waiter{}
		w.waiting[p] = keys
	}
	keys[stored] = append(keys[stored], wt)
	w.n++
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}

	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-wt.done:
		w.waits.WithLabelValues("reached").Inc()
		return r, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	last, removed := w.remove(p, wt)
	if !removed {
		// A round ended the wait while the time ran out.
		w.waits.WithLabelValues("reached").Inc()
		return <-wt.done, nil
	}
	if ctx.Err() != nil {
		w.waits.WithLabelValues("canceled").Inc()
		return Result{}, ctx.Err()
	}
	w.waits.WithLabelValues("timeout").Inc()
	if last == nil {
		// No round read the key while it waited (a short wait, or the
		// database failing): read it now, a tenant's rows only for a
		// wait bound to one, so that another tenant's row, a tombstone
		// and a missing key are the same index probe finding nothing.
		states, err := w.read(ctx, p, sh, []string{stored}, tenant)
		if err != nil {
			return Result{}, fmt.Errorf("read %s/%s: %w", projection, key, err)
		}
		s := states[stored]
		last = &s
	}
	return result(*last, tenant, min), nil
}

// Waiting is how many requests wait now.
func (w *Watcher) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// remove takes wt out of the waiters, and says whether it was there
// (a round had not ended its wait) and what the last round saw.
func (w *Watcher) remove(p *watched, wt *waiter) (*state, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := w.waiting[p][wt.key]
	for i, o := range ws {
		if o == wt {
			ws = append(ws[:i], ws[i+1:]...)
			if len(ws) == 0 {
				delete(w.waiting[p], wt.key)
			} else {
				w.waiting[p][wt.key] = ws
			}
			w.n--
			return wt.last, true
		}
	}
	return nil, false
}

// result is what s is to a waiter of tenant for min.
func result(s state, tenant string, min int64) Result {
	if tenant != "" && s.found && (!s.hasTenant || s.tenant != tenant) {
		return Result{}
	}
	if tenant != "" && !s.found {
		// A tombstone does not say whose the aggregate was.
		return Result{}
	}
	r := Result{Version: s.version, Found: s.found, Deleted: s.deleted}
	r.Reached = (r.Found || r.Deleted) && r.Version >= min
	return r
}

// Run polls for the waiters until ctx ends: one round every
// Config.Poll while anyone waits (less often when rounds take longer
// than Config.Share of the time), at once when a request begins to wait
// after a quiet spell.
func (w *Watcher) Run(ctx context.Context) error {
	for {
		w.mu.Lock()
		n := w.n
		w.mu.Unlock()
		if n == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-w.kick:
			}
		}
		start := time.Now()
		w.round(ctx)
		pause := w.pause(time.Since(start))
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// pause is how long to wait after a round that took took: Poll less the
// round, or longer after a long round, so that reading takes no more
// than Config.Share of the time beyond a tenth of Poll a round.
func (w *Watcher) pause(took time.Duration) time.Duration {
	free := w.cfg.Poll / 10
	return max(w.cfg.Poll-took, time.Duration(float64(took-free)*(1/w.cfg.Share)-float64(took)))
}

// round reads every key someone waits on, one statement per projection,
// and ends the waits that were reached.
func (w *Watcher) round(ctx context.Context) {
	w.mu.Lock()
	todo := make(map[*watched][]string, len(w.waiting))
	for p, keys := range w.waiting {
		for k := range keys {
			todo[p] = append(todo[p], k)
		}
	}
	w.mu.Unlock()
	for p, keys := range todo {
		if len(keys) == 0 {
			continue
		}
		sh, err := w.shapeOf(ctx, p)
		var states map[string]state
		if err == nil {
			states, err = w.read(ctx, p, sh, keys, "")
		}
		if err != nil {
			if ctx.Err() == nil {
				w.heard(err)
			}
			continue
		}
		w.heard(nil)
		w.mu.Lock()
		for _, k := range keys {
			s := states[k]
			ws := w.waiting[p][k]
			kept := ws[:0]
			for _, wt := range ws {
				wt.last = &s
				if r := result(s, wt.tenant, wt.min); r.Reached {
					wt.done <- r
					w.n--
					continue
				}
				kept = append(kept, wt)
			}
			if len(kept) == 0 {
				delete(w.waiting[p], k)
			} else {
				w.waiting[p][k] = kept
			}
		}
		w.mu.Unlock()
	}
}

// heard logs a failing poll once, and once that it works again.
func (w *Watcher) heard(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil && w.failing == "":
		w.failing = err.Error()
		w.cfg.Logger.Warn("reading the versions that reads wait for fails; they wait until their time is up", "error", err)
	case err == nil && w.failing != "":
		w.failing = ""
		w.cfg.Logger.Info("reading the versions that reads wait for works again")
	}
}

// read reads the rows and tombstones of keys (stored forms) in one
// statement; with tenant (in a projection scoped by tenant), that
// tenant's rows only and no tombstones, which such a wait never sees.
func (w *Watcher) read(ctx context.Context, p *watched, sh *shape, keys []string, tenant string) (map[string]state, error) {
	var rows pgx.Rows
	var err error
	if tenant != "" && sh.pollTenant != "" {
		rows, err = w.pool.Query(ctx, sh.pollTenant, keys, tenant)
	} else {
		rows, err = w.pool.Query(ctx, sh.poll, keys, p.p.Table, w.cfg.Identity, p.p.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("read versions of %d keys of %s: %w", len(keys), p.p.Name, err)
	}
	out := make(map[string]state, len(keys))
	var (
		key       string
		version   int64
		rowTenant *string
		tombstone bool
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &version, &rowTenant, &tombstone}, func() error {
		s := out[key]
		if tombstone {
			if !s.found || version > s.version {
				s = state{version: version, deleted: true}
			}
		} else if !s.deleted || version > s.version {
			s = state{version: version, found: true}
			if rowTenant != nil {
				s.tenant, s.hasTenant = *rowTenant, true
			}
		}
		out[key] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read versions of %d keys of %s: %w", len(keys), p.p.Name, err)
	}
	return out, nil
}

// shapeOf reads p's key column type from the catalog, once it can: the
// table may not exist yet when the process starts.
func (w *Watcher) shapeOf(ctx context.Context, p *watched) (*shape, error) {
	p.once.Lock()
	defer p.once.Unlock()
	generations, err := w.generations(ctx)
	if err != nil {
		return nil, err
	}
	// Read again once the projection may have generations: its
	// tombstones may then be under another table's name.
	if p.shape != nil && p.shape.generations == generations {
		return p.shape, nil
	}
	var keyType string
	err = w.pool.QueryRow(ctx, `SELECT coalesce((SELECT format_type(a.atttypid, NULL) FROM pg_attribute a
			WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped), '')`,
		quoteTable(p.p.Table), p.p.KeyColumn).Scan(&keyType)
	if err != nil {
		return nil, fmt.Errorf("read the key column of %s: %w", p.p.Name, err)
	}
	if keyType == "" {
		return nil, fmt.Errorf("read the key column of %s: table %s has no column %q (not created yet?)", p.p.Name, p.p.Table, p.p.KeyColumn)
	}
	sh := &shape{keyType: keyType, textKey: keyType == "text" || keyType == "character varying", generations: generations}
	tenant := "NULL::text"
	if p.tenant != "" {
		tenant = "t." + pgx.Identifier{p.tenant}.Sanitize() + "::text"
	}
	// A rebuilt projection's tombstones are stored under its live
	// generation's table; its name is a view of that table.
	tombTable := "$2"
	if generations {
		tombTable = `coalesce((SELECT g.physical_table FROM projector_generations g
			WHERE g.identity = $3 AND g.projection = $4 AND g.state = 'live'), $2)`
	} else {
		tombTable = "$2 AND $3::text IS NOT NULL AND $4::text IS NOT NULL"
	}
	keyCol := "t." + pgx.Identifier{p.p.KeyColumn}.Sanitize()
	sh.poll = fmt.Sprintf(`SELECT %[1]s::text, t.version, %[2]s, false FROM %[3]s t WHERE %[1]s = ANY($1::text[]::%[4]s[])
		UNION ALL
		SELECT key, version, NULL, true FROM projector_tombstones WHERE table_name = %[5]s AND key = ANY($1::text[])`,
		keyCol, tenant, quoteTable(p.p.Table), keyType, tombTable)
	if p.tenant != "" {
		// As the read API reads by key for a tenant: the row is read
		// only once an index-only probe of the engine's index on the
		// tenant and key columns found it, so that another tenant's row
		// is never read from the table, and costs what a missing key
		// does.
		tenantCol, plainKey := pgx.Identifier{p.tenant}.Sanitize(), pgx.Identifier{p.p.KeyColumn}.Sanitize()
		sh.pollTenant = fmt.Sprintf(`SELECT %[1]s::text, t.version, %[2]s, false FROM %[3]s t
			WHERE %[1]s = ANY($1::text[]::%[4]s[]) AND t.%[5]s = $2
			AND EXISTS (SELECT FROM %[3]s projector_probe WHERE projector_probe.%[5]s = $2 AND projector_probe.%[6]s = ANY($1::text[]::%[4]s[]))`,
			keyCol, tenant, quoteTable(p.p.Table), keyType, tenantCol, plainKey)
	}
	p.shape = sh
	return sh, nil
}

// canonical is key as the table stores it, written back as text (a uuid
// in lower case, a number without leading zeros), and false when no row
// can have it (not a valid value of the key's type).
func (w *Watcher) canonical(ctx context.Context, sh *shape, key string) (string, bool, error) {
	if sh.textKey {
		return key, true, nil
	}
	var out string
	err := w.pool.QueryRow(ctx, fmt.Sprintf(`SELECT $1::text::%s::text`, sh.keyType), key).Scan(&out)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && strings.HasPrefix(pg.Code, "22") {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read key as %s: %w", sh.keyType, err)
	}
	return out, true, nil
}

// quoteTable quotes a plain or schema-qualified table name.
func quoteTable(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }
