package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/sinks"
)

// DefaultAcquireTimeout bounds how long the commit path waits for a
// connection of the pool unless told otherwise (see Sink.SetAcquireTimeout).
// Partitions share the pool and wait for each other's transactions, which
// take seconds at most; a wait this long means the pool is stuck, and the
// batch fails and is retried with backoff rather than wait without end.
const DefaultAcquireTimeout = 30 * time.Second

// SQLSTATE codes the sink branches on.
const (
	uniqueViolation = "23505"
)

// acquire takes a connection of pool, waiting at most timeout for one to
// come free; ctx still bounds what the caller does with it.
func acquire(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pool.Acquire(actx)
	if err != nil {
		return nil, acquireError(ctx, actx, pool, timeout, err)
	}
	return conn, nil
}

// begin begins a transaction on a connection of pool, waiting at most
// timeout for one. The transaction gives the connection back when it ends.
func begin(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration, opts pgx.TxOptions) (pgx.Tx, error) {
	// The deadline covers taking the connection and sending BEGIN only:
	// pgx watches a context just for the call it is given to.
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tx, err := pool.BeginTx(actx, opts)
	if err != nil {
		return nil, acquireError(ctx, actx, pool, timeout, fmt.Errorf("begin: %w", err))
	}
	return tx, nil
}

// acquireError says that no connection came free in time when that is
// why err happened.
func acquireError(ctx, actx context.Context, pool *pgxpool.Pool, timeout time.Duration, err error) error {
	if actx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("no connection of the pool (at most %d) came free within %s: %w", pool.Config().MaxConns, timeout, err)
	}
	return err
}

// staleSession reports a failure that may be the session's own rather
// than the database's: a session keeps the settings it began with
// (ALTER DATABASE or ALTER ROLE ... SET reach new sessions only), so one
// opened while default_transaction_read_only was on refuses writes
// (25006) after it is turned off, and one opened under a shorter
// statement_timeout (57014) keeps it after it is raised. A read-only
// session is also what a connection to a server that became a standby
// holds, where a new connection may reach the new primary. Failures that
// end the session themselves (FATAL: 57P01-03, 25P03, class 08) close
// the connection already, and pgx drops a statement a changed table
// invalidated (0A000) from its cache.
func staleSession(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "25006", // read_only_sql_transaction
		"57014": // query_canceled: statement_timeout, a cancel request
		return true
	}
	return false
}

// dropStale closes conn when err says its session may carry stale state
// (see staleSession): the pool then discards it instead of handing the
// same session to the next attempt.
func dropStale(conn *pgconn.PgConn, err error) {
	if conn == nil || !staleSession(err) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx) // closed either way; the pool sees it closed on release
}

// limitSettings names, by SQLSTATE, the settings whose limit a
// transaction too big for them meets: the statement or the transaction
// runs too long (57014 statement_timeout, 25P04 transaction_timeout),
// the session idles too long inside the transaction while the worker
// plans a batch (25P03), or a statement spills more to temporary files
// than allowed (53400). Waits for locks (55P03 lock_timeout) and
// deadlocks are contention, not size: they stay transient failures; a
// data or size error of a record (class 54) is the record's.
var limitSettings = map[string]string{
	"57014": "statement_timeout",
	"25P04": "transaction_timeout",
	"25P03": "idle_in_transaction_session_timeout",
	"53400": "temp_file_limit",
}

// limited marks err as *sinks.LimitError when the transaction met a limit
// of limitSettings, with the setting's value as a session of pool shows
// it; not when ctx ended (pgx cancels the statement then, which fails
// with 57014 too).
func limited(ctx context.Context, pool *pgxpool.Pool, err error) error {
	var pg *pgconn.PgError
	if err == nil || ctx.Err() != nil || !errors.As(err, &pg) {
		return err
	}
	setting, ok := limitSettings[pg.Code]
	if !ok {
		return err
	}
	lim := &sinks.LimitError{SQLState: pg.Code, Setting: setting, Err: err}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = pool.QueryRow(sctx, `SELECT current_setting($1, true)`, setting).Scan(&lim.Value) // "" when not read: the limit is named anyway
	return lim
}
