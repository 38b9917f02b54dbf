package freshness_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

func accounts() *projection.Projection {
	return &projection.Projection{Name: "accounts", Topic: "accounts", Table: "accounts", KeyField: "id", KeyColumn: "id",
		Columns: []projection.Column{{Name: "id", Type: "text", PrimaryKey: true}, {Name: "tenant", Type: "text"}}}
}

// polls counts the watcher's round statements.
type polls struct{ n atomic.Int64 }

func (p *polls) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "UNION ALL") {
		p.n.Add(1)
	}
	return ctx
}
func (p *polls) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type fixture struct {
	db    *testenv.DB
	pool  *pgxpool.Pool
	w     *freshness.Watcher
	polls *polls
}

func start(t *testing.T, cfg freshness.Config) *fixture {
	t.Helper()
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := accounts()
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, polls: &polls{}}
	pc.ConnConfig.Tracer = f.polls
	f.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	if cfg.Identity == "" {
		cfg.Identity = "group"
	}
	if cfg.TenantColumns == nil {
		cfg.TenantColumns = map[string]string{"accounts": "tenant"}
	}
	f.w, err = freshness.NewWatcher(f.pool, []*projection.Projection{p}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.w.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher: %v", err)
		}
	})
	return f
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) put(t *testing.T, key, tenant string, version int64) {
	t.Helper()
	f.exec(t, `INSERT INTO accounts (id, tenant, version) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET version = excluded.version, tenant = excluded.tenant`, key, tenant, version)
}

// TestWaitReachedAtOnce: a row already at the version answers without
// waiting out the time limit, with its version.
func TestWaitReachedAtOnce(t *testing.T) {
	f := start(t, freshness.Config{})
	f.put(t, "a", "t1", 3)
	began := time.Now()
	r, err := f.w.WaitVersion(t.Context(), "accounts", "a", "", 2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r != (freshness.Result{Version: 3, Found: true, Reached: true}) {
		t.Fatalf("result %+v, want version 3 found and reached", r)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("took %v", took)
	}
}

// TestWaitReachedAfterUpdate: a wait ends when the row is written at
// the version, not before.
func TestWaitReachedAfterUpdate(t *testing.T) {
	f := start(t, freshness.Config{})
	f.put(t, "a", "t1", 1)
	got := make(chan freshness.Result, 1)
	go func() {
		r, err := f.w.WaitVersion(context.Background(), "accounts", "a", "", 2, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	// The waiter has been polled at version 1 (at least one round read it)
	// before the update.
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("a round ran", func() bool { return f.polls.n.Load() >= 2 }))
	select {
	case r := <-got:
		t.Fatalf("wait ended before the update: %+v", r)
	default:
	}
	f.put(t, "a", "t1", 2)
	r := <-got
	if r != (freshness.Result{Version: 2, Found: true, Reached: true}) {
		t.Fatalf("result %+v, want version 2 found and reached", r)
	}
}

// TestWaitDeleted: an aggregate deleted at a version at least the one
// waited for ends the wait as deleted, with its last version.
func TestWaitDeleted(t *testing.T) {
	f := start(t, freshness.Config{})
	f.exec(t, `INSERT INTO projector_tombstones (table_name, key, version) VALUES ('accounts', 'gone', 7)`)
	r, err := f.w.WaitVersion(t.Context(), "accounts", "gone", "", 5, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r != (freshness.Result{Version: 7, Deleted: true, Reached: true}) {
		t.Fatalf("result %+v, want deleted at 7 and reached", r)
	}
}

// TestWaitTimeout: a wait whose version never comes ends at its time
// limit with the version the row has.
func TestWaitTimeout(t *testing.T) {
	f := start(t, freshness.Config{})
	f.put(t, "a", "t1", 4)
	r, err := f.w.WaitVersion(t.Context(), "accounts", "a", "", 9, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r != (freshness.Result{Version: 4, Found: true}) {
		t.Fatalf("result %+v, want version 4 found, not reached", r)
	}
	r, err = f.w.WaitVersion(t.Context(), "accounts", "missing", "", 1, 100*time.Millisecond)
	if err != nil || r != (freshness.Result{}) {
		t.Fatalf("missing row: %+v, %v; want nothing found", r, err)
	}
}

// TestWaitOtherTenant: another tenant's row, reached or not, is as
// absent as a missing one, and so is a deleted aggregate; the row's own
// tenant sees it.
func TestWaitOtherTenant(t *testing.T) {
	f := start(t, freshness.Config{})
	f.put(t, "a", "t1", 5)
	f.exec(t, `INSERT INTO projector_tombstones (table_name, key, version) VALUES ('accounts', 'gone', 7)`)
	for _, key := range []string{"a", "gone", "missing"} {
		r, err := f.w.WaitVersion(t.Context(), "accounts", key, "t2", 1, 100*time.Millisecond)
		if err != nil || r != (freshness.Result{}) {
			t.Fatalf("%s for tenant t2: %+v, %v; want nothing found", key, r, err)
		}
	}
	r, err := f.w.WaitVersion(t.Context(), "accounts", "a", "t1", 1, 5*time.Second)
	if err != nil || r != (freshness.Result{Version: 5, Found: true, Reached: true}) {
		t.Fatalf("for tenant t1: %+v, %v; want version 5 reached", r, err)
	}
}

// TestTooManyWaiters: past MaxWaiters a wait is refused at once, and a
// canceled wait frees its place.
func TestTooManyWaiters(t *testing.T) {
	f := start(t, freshness.Config{MaxWaiters: 3})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.w.WaitVersion(ctx, "accounts", fmt.Sprint("k", i), "", 1, time.Minute)
			errs <- err
		}()
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("3 waiting", func() bool { return f.w.Waiting() == 3 }))
	if _, err := f.w.WaitVersion(t.Context(), "accounts", "one-more", "", 1, time.Millisecond); !errors.Is(err, freshness.ErrTooManyWaiters) {
		t.Fatalf("wait beyond the bound: %v, want ErrTooManyWaiters", err)
	}
	cancel()
	wg.Wait()
	for range 3 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled wait: %v", err)
		}
	}
	f.put(t, "after", "t1", 1)
	if n := f.w.Waiting(); n != 0 {
		t.Fatalf("%d waiting after the waits were canceled", n)
	}
	r, err := f.w.WaitVersion(t.Context(), "accounts", "after", "", 1, 10*time.Second)
	if err != nil || !r.Reached {
		t.Fatalf("wait after the canceled ones left: %+v, %v", r, err)
	}
}

// TestOneReadPerRound: however many requests wait, on however many
// keys, each round reads the projection with one statement.
func TestOneReadPerRound(t *testing.T) {
	f := start(t, freshness.Config{Poll: 50 * time.Millisecond})
	const waiters = 200
	var wg sync.WaitGroup
	began := time.Now()
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.w.WaitVersion(context.Background(), "accounts", fmt.Sprint("k", i%50), "", 1, time.Second); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(began)
	// A round every 50ms, and at most one more for each waiter that
	// found none to read it before its time was up.
	rounds := f.polls.n.Load()
	if max := int64(took/(50*time.Millisecond)) + 2 + waiters; rounds > max {
		t.Fatalf("%d statements in %v", rounds, took)
	}
	if rounds > int64(took/(50*time.Millisecond))+2+waiters/10 {
		t.Fatalf("%d statements in %v for %d waiters: more than one a round", rounds, took, waiters)
	}
}

// TestKeyOfAnotherType: a key column of another type than text takes
// keys in any form Postgres reads, and a key no row can have waits for
// nothing.
func TestKeyOfAnotherType(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := &projection.Projection{Name: "items", Topic: "items", Table: "items", KeyField: "id", KeyColumn: "id",
		Columns: []projection.Column{{Name: "id", Type: "uuid", PrimaryKey: true}}}
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	w, err := freshness.NewWatcher(db.Pool, []*projection.Projection{p}, freshness.Config{Identity: "g"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(runCtx) //nolint:errcheck // ends with runCtx
	if _, err := db.Pool.Exec(ctx, `INSERT INTO items (id, version) VALUES ('0e4b8d36-9a5c-4c51-9d4e-1f2a3b4c5d6e', 2)`); err != nil {
		t.Fatal(err)
	}
	r, err := w.WaitVersion(ctx, "items", "0E4B8D36-9A5C-4C51-9D4E-1F2A3B4C5D6E", "", 2, 10*time.Second)
	if err != nil || r != (freshness.Result{Version: 2, Found: true, Reached: true}) {
		t.Fatalf("upper-case uuid: %+v, %v", r, err)
	}
	r, err = w.WaitVersion(ctx, "items", "not-a-uuid", "", 1, 10*time.Second)
	if err != nil || r.Reached || r.Found {
		t.Fatalf("invalid key: %+v, %v", r, err)
	}
}

// statements records each statement's text and command tag.
type statements struct {
	mu   sync.Mutex
	sql  []string
	tags []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.sql = append(s.sql, d.SQL)
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s.mu.Lock()
	s.tags = append(s.tags, d.CommandTag.String())
	s.mu.Unlock()
}

func (s *statements) take() (sql, tags []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sql, tags = s.sql, s.tags
	s.sql, s.tags = nil, nil
	return sql, tags
}

// TestWaitOfATenantReadsItsRowsOnly: a wait bound to a tenant that no
// round read before its time was up reads the key with the tenant's
// condition, so that another tenant's row, a deleted aggregate and a
// missing key are one statement returning nothing, as the read API's
// read by key is.
func TestWaitOfATenantReadsItsRowsOnly(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := accounts()
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &statements{}
	pc.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Not run: no round reads a key, each wait reads it at its end.
	w, err := freshness.NewWatcher(pool, []*projection.Projection{p}, freshness.Config{Identity: "group",
		TenantColumns: map[string]string{"accounts": "tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO accounts (id, tenant, version) VALUES ('a', 't1', 5);
		INSERT INTO projector_tombstones (table_name, key, version) VALUES ('accounts', 'gone', 7)`); err != nil {
		t.Fatal(err)
	}
	// The catalog's reads, once.
	if _, err := w.WaitVersion(ctx, "accounts", "warm", "t2", 1, 0); err != nil {
		t.Fatal(err)
	}
	rec.take()
	var first []string
	for _, key := range []string{"a", "gone", "missing"} {
		r, err := w.WaitVersion(ctx, "accounts", key, "t2", 1, time.Millisecond)
		if err != nil || r != (freshness.Result{}) {
			t.Fatalf("%s for tenant t2: %+v, %v; want nothing found", key, r, err)
		}
		sql, tags := rec.take()
		if len(sql) != 1 || !slices.Equal(tags, []string{"SELECT 0"}) {
			t.Fatalf("%s for tenant t2: statements %q tags %q; want one returning no row", key, sql, tags)
		}
		if first == nil {
			first = sql
		} else if !slices.Equal(sql, first) {
			t.Errorf("%s for tenant t2 ran %q, another key %q", key, sql, first)
		}
	}
	r, err := w.WaitVersion(ctx, "accounts", "a", "t1", 1, time.Millisecond)
	if err != nil || r != (freshness.Result{Version: 5, Found: true, Reached: true}) {
		t.Fatalf("a for tenant t1: %+v, %v; want version 5 reached", r, err)
	}
	if sql, _ := rec.take(); !slices.Equal(sql, first) {
		t.Errorf("the row's own tenant ran %q, another %q", sql, first)
	}
}
