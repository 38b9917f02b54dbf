package repair

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/testenv"
)

// loadFixture creates the table data lives in, snaps or evs, and returns the
// query a SQL source reads it with. The query leaves $2 out so that a source
// behind the gap returns its rows instead of none.
func loadFixture(t *testing.T, db *testenv.DB, data fixture) string {
	t.Helper()
	ctx := t.Context()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if data.eventsShaped() {
		exec(`CREATE TABLE evs (key text NOT NULL, version bigint NOT NULL, type text, fields jsonb)`)
		for _, e := range data.events {
			var fields any
			if e.fields != "" {
				fields = e.fields
			}
			exec(`INSERT INTO evs VALUES ($1, $2, $3, $4)`, e.key, e.version, e.typ, fields)
		}
		// Columns in another order than the contract names them.
		return `SELECT fields, version, type FROM evs WHERE key = $1`
	}
	exec(`CREATE TABLE snaps (key text NOT NULL, version bigint NOT NULL, state jsonb)`)
	for _, s := range data.snapshots {
		exec(`INSERT INTO snaps VALUES ($1, $2, $3)`, s.key, s.version, s.state)
	}
	return `SELECT version, state FROM snaps WHERE key = $1`
}

func newTestSQL(t *testing.T, pool *pgxpool.Pool, query string) *SQL {
	t.Helper()
	s, err := NewSQL(pool, SQLConfig{Query: query})
	if err != nil {
		t.Fatalf("NewSQL: %v", err)
	}
	return s
}

func TestSQLConformance(t *testing.T) {
	runConformance(t, func(t *testing.T, data fixture) Repairer {
		db := testenv.NewDB(t)
		return newTestSQL(t, db.Pool, loadFixture(t, db, data))
	})
}

// sqlSource returns a SQL source over a fresh schema prepared by setup.
func sqlSource(t *testing.T, setup, query string) *SQL {
	t.Helper()
	db := testenv.NewDB(t)
	if setup != "" {
		if _, err := db.Pool.Exec(t.Context(), setup); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return newTestSQL(t, db.Pool, query)
}

const snapsSetup = `
CREATE TABLE snaps (key text, version bigint, state jsonb, state_text text, state_json json, n int);
INSERT INTO snaps VALUES
	('a', 3, '{"v": 3}', '{"v": 3}', '{"v": 3}', 1),
	('a', 6, '{"v": 6}', '{"v":6, "t": [1, 2]}', '{"v":  6}', 1),
	('a', 5, '{"v": 5}', '{"v": 5}', '{"v": 5}', 1),
	('tie', 4, '{"v": 4}', '{"v": 4}', '{"v": 4}', 1),
	('tie', 4, '{"v": 4, "other": true}', '{"v": 4}', '{"v": 4}', 1),
	('same', 4, '{"v": 4}', '{"v": 4}', '{"v": 4}', 1),
	('same', 4, '{"v": 4}', '{"v": 4}', '{"v": 4}', 1),
	('nullstate', 4, NULL, NULL, NULL, 1),
	('nullversion', NULL, '{}', '{}', '{}', 1),
	('badjson', 4, '{}', '{"v": ', '{}', 1),
	('array', 4, '[1]', '[1]', '[1]', 1);
`

func TestSQLSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name, query, key string
		wantVersion      int64
		wantV            any    // state's v
		wantErr          string // instead
	}{
		{"highest version wins", `SELECT version, state FROM snaps WHERE key = $1`, "a", 6, int64(6), ""},
		{"text column", `SELECT state_text AS state, version FROM snaps WHERE key = $1`, "a", 6, int64(6), ""},
		{"json column", `SELECT version, state_json AS state FROM snaps WHERE key = $1`, "a", 6, int64(6), ""},
		{"literal", `SELECT 7 AS version, '{"v": 1.5}' AS state WHERE $1 <> ''`, "a", 7, 1.5, ""},
		{"int version", `SELECT version::int AS version, state FROM snaps WHERE key = $1`, "a", 6, int64(6), ""},
		{"uses $2", `SELECT version, state FROM snaps WHERE key = $1 AND version >= $2`, "a", 6, int64(6), ""},
		{"identical rows at the top", `SELECT version, state FROM snaps WHERE key = $1`, "same", 4, int64(4), ""},
		{"different rows at the top", `SELECT version, state FROM snaps WHERE key = $1`, "tie", 0, nil, "two rows have version 4"},
		{"null state", `SELECT version, state FROM snaps WHERE key = $1`, "nullstate", 0, nil, "version 4: state is NULL"},
		{"null version", `SELECT version, state FROM snaps WHERE key = $1`, "nullversion", 0, nil, "NULL version"},
		{"invalid json text", `SELECT version, state_text AS state FROM snaps WHERE key = $1`, "badjson", 0, nil, "version 4: state: invalid JSON"},
		{"state not an object", `SELECT version, state FROM snaps WHERE key = $1`, "array", 0, nil, "state: want a JSON object, got an array"},
		{"state of another type", `SELECT version, n AS state FROM snaps WHERE key = $1`, "a", 0, nil, "column state is int4: want json, jsonb or text"},
		{"version of another type", `SELECT 'x'::text AS version, state FROM snaps WHERE key = $1`, "a", 0, nil, "column version is text: want bigint"},
		{"numeric version", `SELECT version::numeric AS version, state FROM snaps WHERE key = $1`, "a", 6, int64(6), ""},
		{"fractional version", `SELECT 6.5 AS version, state FROM snaps WHERE key = $1`, "a", 0, nil, "a row has version 6.5: want an integer"},
		{"three parameters", `SELECT version, state FROM snaps WHERE key = $1 AND version >= $2 AND n = $3`, "a", 0, nil, "query has 3 parameters"},
		{"syntax error", `SELECT version, state FROM snaps WHERE`, "a", 0, nil, "SQLSTATE 42601"},
		{"unknown table", `SELECT version, state FROM nope WHERE key = $1`, "a", 0, nil, "SQLSTATE 42P01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := sqlSource(t, snapsSetup, tc.query)
			res, err := s.Repair(t.Context(), tc.key, 3)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Repair = %#v, %v; want an error mentioning %q", res, err, tc.wantErr)
				}
				if IsTransient(err) || errors.Is(err, ErrNotFound) {
					t.Errorf("error %v: transient %v, not found %v; want neither", err, IsTransient(err), errors.Is(err, ErrNotFound))
				}
				return
			}
			if err != nil {
				t.Fatalf("Repair: %v", err)
			}
			if res.Version != tc.wantVersion || res.Snapshot["v"] != tc.wantV || res.Events != nil {
				t.Fatalf("Repair = %#v, want version %d with v = %v", res, tc.wantVersion, tc.wantV)
			}
		})
	}
}

func TestSQLEvents(t *testing.T) {
	const setup = `
CREATE TABLE evs (key text, version bigint, type text, fields jsonb, fields_text text);
INSERT INTO evs VALUES
	('a', 1, 'created', '{}', '{}'),
	('a', 2, NULL, '{"n": 2}', '{"n": 2}'),
	('a', 3, 'x', '{"n": 3}', '{"n": 3.5}'),
	('a', 4, 'x', '[]', '[]');
`
	t.Run("filtered with $2", func(t *testing.T) {
		t.Parallel()
		s := sqlSource(t, setup, `SELECT version, type, fields FROM evs WHERE key = $1 AND version >= $2 AND version < 4`)
		res, err := s.Repair(t.Context(), "a", 2)
		if err != nil {
			t.Fatalf("Repair: %v", err)
		}
		if res.Version != 3 || len(res.Events) != 2 || res.Events[0].Type != "" || res.Events[0].Fields["n"] != int64(2) || res.Events[1].Key != "a" {
			t.Fatalf("Repair = %#v", res)
		}
		// Filtering on $2 makes a source behind the gap return no rows.
		if _, err := s.Repair(t.Context(), "a", 9); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Repair beyond the source's last event = %v, want ErrNotFound", err)
		}
	})
	t.Run("text fields", func(t *testing.T) {
		t.Parallel()
		s := sqlSource(t, setup, `SELECT version, type, fields_text AS fields FROM evs WHERE key = $1 AND version < 4`)
		res, err := s.Repair(t.Context(), "a", 3)
		if err != nil {
			t.Fatalf("Repair: %v", err)
		}
		if res.Version != 3 || len(res.Events) != 1 || res.Events[0].Fields["n"] != 3.5 {
			t.Fatalf("Repair = %#v", res)
		}
	})
	t.Run("type of another type", func(t *testing.T) {
		t.Parallel()
		s := sqlSource(t, setup, `SELECT version, 1 AS type, fields FROM evs WHERE key = $1`)
		_, err := s.Repair(t.Context(), "a", 3)
		if err == nil || !strings.Contains(err.Error(), "column type is int4: want text") || IsTransient(err) {
			t.Fatalf("Repair = %v, want a non-transient error about the type column", err)
		}
	})
	t.Run("fields not an object", func(t *testing.T) {
		t.Parallel()
		s := sqlSource(t, setup, `SELECT version, type, fields FROM evs WHERE key = $1`)
		_, err := s.Repair(t.Context(), "a", 3)
		if err == nil || !strings.Contains(err.Error(), "version 4: fields: want a JSON object, got an array") || IsTransient(err) {
			t.Fatalf("Repair = %v, want a non-transient error about version 4's fields", err)
		}
	})
}

func TestSQLWrongColumns(t *testing.T) {
	for _, query := range []string{
		`SELECT version FROM snaps WHERE key = $1`,
		`SELECT version, state, n FROM snaps WHERE key = $1`,
		`SELECT version, state AS fields FROM snaps WHERE key = $1`,
		`SELECT version, state AS "State" FROM snaps WHERE key = $1`,
		`SELECT version, state, state FROM snaps WHERE key = $1`,
		`SELECT * FROM snaps WHERE false AND key = $1`, // no rows: still the wrong columns
	} {
		t.Run(query, func(t *testing.T) {
			t.Parallel()
			s := sqlSource(t, snapsSetup, query)
			_, err := s.Repair(t.Context(), "a", 3)
			if err == nil || IsTransient(err) || errors.Is(err, ErrNotFound) {
				t.Fatalf("Repair = %v, want a non-transient error", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "(version, state)") || !strings.Contains(msg, "(version, type, fields)") {
				if !strings.Contains(msg, "twice") {
					t.Errorf("error %q does not name the expected columns", msg)
				}
			}
		})
	}
}

// onePool returns a pool of a single connection to a fresh schema.
func onePool(t *testing.T) (*testenv.DB, *pgxpool.Pool) {
	t.Helper()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), snapsSetup); err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("parse config: %v", err)
	}
	cfg.MaxConns = 1
	// Hand out idle connections unchecked, however long they idled, so a
	// query meets a dead connection instead of the pool replacing it.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return db, pool
}

func TestSQLTransient(t *testing.T) {
	const query = `SELECT version, state FROM snaps WHERE key = $1`
	check := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("Repair succeeded")
		}
		t.Logf("error: %v", err)
		if !IsTransient(err) {
			t.Errorf("IsTransient(%v) = false", err)
		}
		if errors.Is(err, ErrNotFound) {
			t.Errorf("error %v is ErrNotFound", err)
		}
	}

	t.Run("connection terminated by the query", func(t *testing.T) {
		t.Parallel()
		_, pool := onePool(t)
		s := newTestSQL(t, pool, query+` AND pg_terminate_backend(pg_backend_pid())`)
		_, err := s.Repair(t.Context(), "a", 3)
		check(t, err)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57P01" {
			t.Errorf("error %v is not SQLSTATE 57P01", err)
		}
	})
	t.Run("idle connection terminated", func(t *testing.T) {
		t.Parallel()
		db, pool := onePool(t)
		s := newTestSQL(t, pool, query)
		if _, err := s.Repair(t.Context(), "a", 3); err != nil {
			t.Fatalf("Repair: %v", err)
		}
		var pid uint32
		if err := pool.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatalf("backend pid: %v", err)
		}
		var done bool
		if err := db.Pool.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&done); err != nil || !done {
			t.Fatalf("terminate backend %d: %v, %v", pid, done, err)
		}
		_, err := s.Repair(t.Context(), "a", 3)
		check(t, err)
	})
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		_, pool := onePool(t)
		s := newTestSQL(t, pool, query)
		pool.Close()
		_, err := s.Repair(t.Context(), "a", 3)
		check(t, err)
	})
	t.Run("unreachable server", func(t *testing.T) {
		t.Parallel()
		pool, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
		if err != nil {
			t.Fatalf("pool: %v", err)
		}
		t.Cleanup(pool.Close)
		_, err = newTestSQL(t, pool, query).Repair(t.Context(), "a", 3)
		check(t, err)
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		db, pool := onePool(t)
		// The query waits for an advisory lock another session holds until
		// the test ends.
		s := newTestSQL(t, pool, query+` AND pg_advisory_xact_lock(hashtext(current_schema())) IS NOT NULL`)
		tx, err := db.Pool.Begin(t.Context())
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		defer tx.Rollback(t.Context())
		if _, err := tx.Exec(t.Context(), `SELECT pg_advisory_xact_lock(hashtext(current_schema()))`); err != nil {
			t.Fatalf("lock: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err = s.Repair(ctx, "a", 3)
		check(t, err)
	})
	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		_, pool := onePool(t)
		s := newTestSQL(t, pool, query)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := s.Repair(ctx, "a", 3)
		if err == nil || IsTransient(err) {
			t.Fatalf("Repair with a cancelled context = %v, want a non-transient error", err)
		}
	})
}

func TestNewSQLValidates(t *testing.T) {
	db := testenv.NewDB(t)
	if _, err := NewSQL(db.Pool, SQLConfig{Query: "  \n"}); err == nil || !strings.Contains(err.Error(), "query is required") {
		t.Errorf("NewSQL(empty query) = %v", err)
	}
	if _, err := NewSQL(nil, SQLConfig{Query: "SELECT 1"}); err == nil {
		t.Errorf("NewSQL(nil pool) succeeded")
	}
}

func TestIsTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("plain"), false},
		{ErrNotFound, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "08001"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "57P02"}, true},
		{&pgconn.PgError{Code: "57P03"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{&pgconn.PgError{Code: "53100"}, true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "57014"}, true},
		{&pgconn.PgError{Code: "57000"}, false},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "42P01"}, false},
		{&pgconn.PgError{Code: "28P01", Message: "connection failure"}, false},
		{&acquireError{&pgconn.PgError{Code: "3D000"}}, false},
		{&acquireError{errors.New("closed pool")}, true},
		{&statusError{code: 500}, true},
		{&statusError{code: 429}, true},
		{&statusError{code: 409}, false},
	} {
		wrapped := errors.Join(errors.New("context"), tc.err)
		if tc.err == nil {
			wrapped = nil
		}
		if got := IsTransient(wrapped); got != tc.want {
			t.Errorf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestSQLReadsOnly runs queries that write to the source: each must fail
// as a read-only violation (SQLSTATE 25006), neither transient nor "not
// found", and the source's rows must all still be there.
func TestSQLReadsOnly(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, snapsSetup+`
CREATE SEQUENCE seq;
CREATE FUNCTION forget(k text) RETURNS bigint LANGUAGE sql AS $$ DELETE FROM snaps WHERE key = k RETURNING version $$;`); err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, query := range []string{
		`WITH d AS (DELETE FROM snaps WHERE key = $1 RETURNING version, state) SELECT version, state FROM d`,
		`WITH u AS (UPDATE snaps SET version = version + 100 WHERE key = $1 RETURNING version, state) SELECT version, state FROM u`,
		`SELECT forget($1) AS version, '{}'::jsonb AS state`,
		`SELECT nextval('seq') AS version, '{}'::jsonb AS state WHERE $1 <> ''`,
	} {
		s := newTestSQL(t, db.Pool, query)
		res, err := s.Repair(ctx, "a", 3)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
			t.Errorf("%s:\nRepair = %#v, %v; want a read-only violation (SQLSTATE 25006)", query, res, err)
		}
		if IsTransient(err) || errors.Is(err, ErrNotFound) {
			t.Errorf("%s: error %v: transient %v, not found %v; want neither", query, err, IsTransient(err), errors.Is(err, ErrNotFound))
		}
	}
	var n, top, next int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(version) FILTER (WHERE key = 'a'), 0), (SELECT last_value FROM seq) FROM snaps`).Scan(&n, &top, &next); err != nil {
		t.Fatal(err)
	}
	if n != 11 || top != 6 || next != 1 {
		t.Errorf("the source changed: %d rows (want 11), key a at version %d (want 6), sequence at %d (want 1)", n, top, next)
	}
}
