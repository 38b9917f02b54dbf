package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/projection"
)

// DefaultTombstonePruneBatch is how many tombstones one statement of
// PruneTombstones deletes at most: each batch is its own short
// transaction, so that neither the rows' locks nor the WAL of one
// statement grow with the number of tombstones due.
const DefaultTombstonePruneBatch = 1000

// pruneTombstonesSQL deletes at most $3 of table $1's tombstones written
// before $2, oldest first, through the (table_name, deleted_at) index. The
// keys are chosen once, in an ARRAY subquery (an init plan): as a join,
// Postgres may run the chooser again per row and delete more than $3. It
// skips the rows another transaction has locked: a member deleting the
// aggregate again (which moves deleted_at on) or another replica pruning
// the same tombstones, so that replicas pruning together share the work
// instead of waiting on each other. The condition on deleted_at is
// checked again on the row as it is once locked: a tombstone written
// anew meanwhile stays.
const pruneTombstonesSQL = `DELETE FROM projector_tombstones
	WHERE table_name = $1 AND deleted_at < $2
	  AND key = ANY (ARRAY(SELECT key FROM projector_tombstones
	                       WHERE table_name = $1 AND deleted_at < $2
	                       ORDER BY deleted_at LIMIT $3
	                       FOR UPDATE SKIP LOCKED))`

// PruneTombstones deletes the tombstones of table (a projection's Table,
// as written) that were written before before, in batches of at most
// batch rows (0 or less: DefaultTombstonePruneBatch), each committed on
// its own, until none is left or ctx ends. It returns how many it
// deleted, also when it fails part way. Several replicas may prune one
// table at the same time: each deletes a tombstone at most once between
// them, and none waits for the others.
func PruneTombstones(ctx context.Context, pool *pgxpool.Pool, table string, before time.Time, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultTombstonePruneBatch
	}
	var pruned int64
	for {
		tag, err := pool.Exec(ctx, pruneTombstonesSQL, table, before, batch)
		if err != nil {
			return pruned, fmt.Errorf("prune tombstones of %s written before %s: %w", table, before.UTC().Format(time.RFC3339), err)
		}
		pruned += tag.RowsAffected()
		// A short batch is the last one due (or the rest is locked by
		// whoever is deleting it).
		if tag.RowsAffected() < int64(batch) {
			return pruned, nil
		}
	}
}

// PruneTombstones is the package's PruneTombstones on the store's pool,
// for the engine's background pruning.
func (s *Store) PruneTombstones(ctx context.Context, table string, before time.Time, batch int) (int64, error) {
	return PruneTombstones(ctx, s.pool, table, before, batch)
}

// Tombstone is what projector_tombstones keeps of a deleted aggregate: the
// last version it had, and when it was deleted.
type Tombstone struct {
	Key       string
	Version   int64
	DeletedAt time.Time
}

// ErrRowExists refuses to forget the tombstone of an aggregate whose row
// exists: the aggregate is not deleted, and erasing a live row is a delete
// event's job, which writes the tombstone anew.
var ErrRowExists = errors.New("the aggregate's row exists")

// FindTombstone returns the tombstone of p's aggregate key (nil when it
// has none) and whether the aggregate's row exists in p's table. It
// changes nothing.
func FindTombstone(ctx context.Context, pool *pgxpool.Pool, p *projection.Projection, key string) (*Tombstone, bool, error) {
	var (
		found  *Tombstone
		exists bool
	)
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var t Tombstone
		err := tx.QueryRow(ctx, `SELECT version, deleted_at FROM projector_tombstones WHERE table_name = $1 AND key = $2`, p.Table, key).
			Scan(&t.Version, &t.DeletedAt)
		switch {
		case err == nil:
			t.Key, found = key, &t
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("projection %q: read the tombstone of an aggregate of table %s: %w", p.Name, p.Table, err)
		}
		exists, err = aggregateRowExists(ctx, tx, p, key)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return found, exists, nil
}

// aggregateRowExists reports whether p's table holds the row of aggregate key,
// found through the key's index as the sink's statements find it. A key
// the key column's type cannot hold (not a number for a bigint key) has
// no row: Postgres's refusal of it is taken back under a savepoint.
func aggregateRowExists(ctx context.Context, tx pgx.Tx, p *projection.Projection, key string) (bool, error) {
	var exists bool
	stmt := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s = $1::text::%s)`, quoteTable(p.Table), quoteIdent(p.KeyColumn), p.Columns[0].Type)
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		return sp.QueryRow(ctx, stmt, key).Scan(&exists)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("projection %q: look up an aggregate's row in table %s: %w", p.Name, p.Table, err)
	}
	return exists, nil
}

// ForgetTombstone deletes the tombstone of p's aggregate key, for an
// erasure request, and returns it (nil when there was none). It refuses,
// with ErrRowExists, an aggregate whose row exists, checked in the
// transaction that deletes so that nothing is deleted then.
//
// Once forgotten, a late copy of one of the aggregate's events is no
// longer known to be stale: the version gate treats the aggregate as
// never seen.
func ForgetTombstone(ctx context.Context, pool *pgxpool.Pool, p *projection.Projection, key string) (*Tombstone, error) {
	var forgotten *Tombstone
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var t Tombstone
		err := tx.QueryRow(ctx, `DELETE FROM projector_tombstones WHERE table_name = $1 AND key = $2 RETURNING version, deleted_at`, p.Table, key).
			Scan(&t.Version, &t.DeletedAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("projection %q: delete the tombstone of an aggregate of table %s: %w", p.Name, p.Table, err)
		default:
			t.Key, forgotten = key, &t
		}
		exists, err := aggregateRowExists(ctx, tx, p, key)
		if err != nil {
			return err
		}
		if exists {
			forgotten = nil
			return fmt.Errorf("projection %q: table %s: %w: forget only the tombstone of a deleted aggregate", p.Name, p.Table, ErrRowExists)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return forgotten, nil
}
