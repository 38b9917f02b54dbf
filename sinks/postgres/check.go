package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/projection"
)

// Check proves the projections against Postgres as Migrate does before it
// creates anything, and compares each table that exists with its
// projection, without creating or changing anything: it runs in a
// read-only transaction that it rolls back. problems holds one error per
// problem found (wrapping ErrBadType, ErrBadDefault, ErrTableShared or
// ErrTableMismatch, and ErrUnfilledColumn too where that is why), all of them, not only the first; err reports failing
// to ask. Like Migrate it gives each column whose type resolves the name
// Postgres gives its type.
func Check(ctx context.Context, pool *pgxpool.Pool, projections ...*projection.Projection) (problems []error, err error) {
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var resolved []*projection.Projection
		for _, p := range projections {
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return resolve(ctx, sp, []*projection.Projection{p}) })
			switch {
			case errors.Is(err, ErrBadType):
				// The table's columns cannot be compared with a type that
				// is none.
				problems = append(problems, err)
				continue
			case isProblem(err):
				problems = append(problems, err)
			case err != nil:
				return err
			default:
				resolved = append(resolved, p)
			}
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Table).Scan(&exists); err != nil {
				return fmt.Errorf("projection %q: look up table %s: %w", p.Name, p.Table, err)
			}
			if !exists {
				continue
			}
			found, err := tableProblems(ctx, tx, p)
			if err != nil {
				return err
			}
			for _, f := range found {
				problems = append(problems, f.err(p))
			}
		}
		if len(resolved) > 1 {
			err := distinctTables(ctx, tx, resolved)
			if isProblem(err) {
				problems = append(problems, err)
			} else if err != nil {
				return err
			}
		}
		return errRolledBack // nothing it did is kept, though it changed nothing
	})
	if errors.Is(err, errRolledBack) {
		err = nil
	}
	return problems, err
}

var errRolledBack = errors.New("check: rolled back")

// isProblem reports whether err is one of the projections' (a type, a
// default, a table) rather than a failure to ask Postgres.
func isProblem(err error) bool {
	return errors.Is(err, ErrBadType) || errors.Is(err, ErrBadDefault) || errors.Is(err, ErrTableShared) || errors.Is(err, ErrTableMismatch)
}
