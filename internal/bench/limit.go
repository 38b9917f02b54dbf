package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// limitDDL is the append-only table of the COPY limit: the accounts row
// shape (key, owner, balance, opened_at, version), no index.
const limitDDL = `CREATE TABLE limit_rows (
	account_id text,
	owner      text,
	balance    bigint,
	opened_at  timestamptz,
	version    bigint NOT NULL
)`

// limitKeyedDDL is the table of the keyed COPY limit: the same rows under
// a primary key of (account_id, version), so that every row also enters a
// B-tree, as a new row of a projection enters its key's index (which the
// engine creates in byte order, as here).
const limitKeyedDDL = `CREATE TABLE limit_rows (
	account_id text COLLATE "C",
	owner      text,
	balance    bigint,
	opened_at  timestamptz,
	version    bigint NOT NULL,
	PRIMARY KEY (account_id, version)
)`

// runLimit copies one row per event of the stream into an append-only
// table (keyed: one with a primary key) with pgx CopyFrom over CopyConns
// connections at once: the ceiling of what this Postgres ingests, with no
// Kafka, no decoding and no version or offset bookkeeping.
func runLimit(ctx context.Context, e *runEnv, keyed bool) error {
	spec := e.spec
	conns := max(1, spec.CopyConns)
	pool, err := openPool(ctx, spec.DatabaseURL, nil, int32(conns))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	ddl := limitDDL
	if keyed {
		ddl = limitKeyedDDL
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return err
	}
	records, err := Generate(spec.Gen)
	if err != nil {
		return err
	}
	if err := e.ready(ctx); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	per := (len(records) + conns - 1) / conns
	for c := range conns {
		part := records[min(len(records), c*per):min(len(records), (c+1)*per)]
		g.Go(func() error {
			row := make([]any, 5)
			_, err := pool.CopyFrom(gctx, pgx.Identifier{"limit_rows"}, []string{"account_id", "owner", "balance", "opened_at", "version"},
				pgx.CopyFromSlice(len(part), func(i int) ([]any, error) {
					ev := part[i].Event
					var owner *string
					if ev.Owner != "" {
						owner = &ev.Owner
					}
					row[0], row[1], row[2], row[3], row[4] = ev.AccountID, owner, ev.Amount, ev.OccurredAt, ev.Version
					return row, nil
				}))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	res := &WorkerResult{}
	e.finish(res, time.Now())
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM limit_rows`).Scan(&n); err != nil {
		return err
	}
	if n != int64(len(records)) {
		return fmt.Errorf("limit_rows holds %d rows, %d were copied", n, len(records))
	}
	res.Events = n
	e.report(ctx, res)
	return nil
}
