package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
