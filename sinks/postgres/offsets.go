package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/sinks"
)

// Offsets stores the next offset of every partition a consumer identity
// owns, and the owner epoch that fences older owners.
type Offsets struct {
	pool     *pgxpool.Pool
	identity string
}

var _ sinks.Offsets = (*Offsets)(nil)

// NewOffsets returns the offset store of identity. Each call waits at most
// DefaultAcquireTimeout for a connection of pool.
func NewOffsets(pool *pgxpool.Pool, identity string) *Offsets {
	return &Offsets{pool: pool, identity: identity}
}

// Claim takes ownership of partitions: it bumps each one's owner epoch,
// which fences every earlier owner, and returns where to resume. All
// partitions are claimed in one statement.
func (o *Offsets) Claim(ctx context.Context, tps []sinks.TP) ([]sinks.Claimed, error) {
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	for i, tp := range tps {
		topics[i], parts[i] = tp.Topic, tp.Partition
	}
	conn, err := acquire(ctx, o.pool, DefaultAcquireTimeout)
	if err != nil {
		return nil, fmt.Errorf("claim %d partitions: %w", len(tps), err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `
		INSERT INTO projector_offsets AS o (identity, topic, partition, owner_epoch)
		SELECT $1, u.topic, u.partition, 1 FROM unnest($2::text[], $3::int[]) AS u(topic, partition)
		ORDER BY 2, 3
		ON CONFLICT (identity, topic, partition)
		DO UPDATE SET owner_epoch = o.owner_epoch + 1, updated_at = now()
		RETURNING topic, partition, owner_epoch, next_offset`, o.identity, topics, parts)
	if err != nil {
		dropStale(conn.Conn().PgConn(), err)
		return nil, fmt.Errorf("claim %d partitions: %w", len(tps), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sinks.Claimed, error) {
		var c sinks.Claimed
		return c, r.Scan(&c.Topic, &c.Partition, &c.Epoch, &c.NextOffset)
	})
	if err != nil {
		dropStale(conn.Conn().PgConn(), err)
		return nil, fmt.Errorf("claim %d partitions: %w", len(tps), err)
	}
	at := time.Now()
	for i := range out {
		out[i].At = at
	}
	return out, nil
}

// Init sets the first offset of a claimed partition that had none stored.
// It returns sinks.ErrFenced when a newer owner exists.
func (o *Offsets) Init(ctx context.Context, c sinks.Claimed, next int64) error {
	conn, err := acquire(ctx, o.pool, DefaultAcquireTimeout)
	if err != nil {
		return fmt.Errorf("store first offset of %s/%d: %w", c.Topic, c.Partition, err)
	}
	defer conn.Release()
	tag, err := conn.Exec(ctx, `UPDATE projector_offsets SET next_offset = $1, updated_at = now()
		WHERE identity = $2 AND topic = $3 AND partition = $4 AND owner_epoch = $5 AND next_offset IS NULL`,
		next, o.identity, c.Topic, c.Partition, c.Epoch)
	if err != nil {
		dropStale(conn.Conn().PgConn(), err)
		return fmt.Errorf("store first offset of %s/%d: %w", c.Topic, c.Partition, err)
	}
	if tag.RowsAffected() == 0 {
		return sinks.ErrFenced
	}
	return nil
}

// InitAll sets the first offsets of claimed partitions that had none
// stored, firsts[i] for claims[i], in one statement. It returns the
// partitions it set: one left out has a newer owner.
func (o *Offsets) InitAll(ctx context.Context, claims []sinks.Claimed, firsts []int64) ([]sinks.TP, error) {
	topics := make([]string, len(claims))
	parts := make([]int32, len(claims))
	epochs := make([]int64, len(claims))
	for i, c := range claims {
		topics[i], parts[i], epochs[i] = c.Topic, c.Partition, c.Epoch
	}
	conn, err := acquire(ctx, o.pool, DefaultAcquireTimeout)
	if err != nil {
		return nil, fmt.Errorf("store first offsets of %d partitions: %w", len(claims), err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `UPDATE projector_offsets AS o SET next_offset = u.next, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS u(topic, partition, epoch, next)
		WHERE o.identity = $1 AND o.topic = u.topic AND o.partition = u.partition
		  AND o.owner_epoch = u.epoch AND o.next_offset IS NULL
		RETURNING o.topic, o.partition`, o.identity, topics, parts, epochs, firsts)
	if err != nil {
		return nil, fmt.Errorf("store first offsets of %d partitions: %w", len(claims), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sinks.TP, error) {
		var tp sinks.TP
		return tp, r.Scan(&tp.Topic, &tp.Partition)
	})
	if err != nil {
		dropStale(conn.Conn().PgConn(), err)
		return nil, fmt.Errorf("store first offsets of %d partitions: %w", len(claims), err)
	}
	return out, nil
}

// Adopt claims a partition again after an operator reset its stored
// offset (Reset) while this member, at epoch mine, owned it: the claim
// succeeds only if the newest epoch is the reset's, so that a member that
// claimed the partition after the reset is never fenced by it. ok is
// false when there is nothing to adopt.
func (o *Offsets) Adopt(ctx context.Context, tp sinks.TP, mine int64) (c sinks.Claimed, ok bool, err error) {
	conn, err := acquire(ctx, o.pool, DefaultAcquireTimeout)
	if err != nil {
		return sinks.Claimed{}, false, fmt.Errorf("adopt the reset offset of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	defer conn.Release()
	err = conn.QueryRow(ctx, `UPDATE projector_offsets AS o SET owner_epoch = o.owner_epoch + 1, updated_at = now()
		WHERE o.identity = $1 AND o.topic = $2 AND o.partition = $3 AND o.owner_epoch > $4 AND o.next_offset IS NOT NULL
		  AND EXISTS (SELECT 1 FROM projector_offsets_audit a
			WHERE a.identity = o.identity AND a.topic = o.topic AND a.partition = o.partition AND a.owner_epoch = o.owner_epoch)
		RETURNING o.owner_epoch, o.next_offset`, o.identity, tp.Topic, tp.Partition, mine).Scan(&c.Epoch, &c.NextOffset)
	if errors.Is(err, pgx.ErrNoRows) {
		return sinks.Claimed{}, false, nil
	}
	if err != nil {
		return sinks.Claimed{}, false, fmt.Errorf("adopt the reset offset of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	c.TP, c.At = tp, time.Now()
	return c, true, nil
}

// Owners reads the owner epoch and stored next offset of partitions
// without claiming them, in one statement; a partition never claimed is
// left out. At is when the row last changed.
func (o *Offsets) Owners(ctx context.Context, tps []sinks.TP) ([]sinks.Claimed, error) {
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	for i, tp := range tps {
		topics[i], parts[i] = tp.Topic, tp.Partition
	}
	rows, err := o.pool.Query(ctx, `SELECT o.topic, o.partition, o.owner_epoch, o.next_offset, o.updated_at
		FROM projector_offsets o JOIN unnest($2::text[], $3::int[]) AS u(topic, partition)
		  ON o.topic = u.topic AND o.partition = u.partition
		WHERE o.identity = $1`, o.identity, topics, parts)
	if err != nil {
		return nil, fmt.Errorf("read the owners of %d partitions: %w", len(tps), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sinks.Claimed, error) {
		var c sinks.Claimed
		return c, r.Scan(&c.Topic, &c.Partition, &c.Epoch, &c.NextOffset, &c.At)
	})
	if err != nil {
		return nil, fmt.Errorf("read the owners of %d partitions: %w", len(tps), err)
	}
	return out, nil
}

// Stored is one partition's stored position.
type Stored struct {
	sinks.TP
	NextOffset *int64
	Epoch      int64
}

// List returns every stored partition of the identity, ordered.
func (o *Offsets) List(ctx context.Context) ([]Stored, error) {
	rows, err := o.pool.Query(ctx, `SELECT topic, partition, next_offset, owner_epoch
		FROM projector_offsets WHERE identity = $1 ORDER BY topic, partition`, o.identity)
	if err != nil {
		return nil, fmt.Errorf("list stored offsets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stored, error) {
		var s Stored
		return s, r.Scan(&s.Topic, &s.Partition, &s.NextOffset, &s.Epoch)
	})
	if err != nil {
		return nil, fmt.Errorf("list stored offsets: %w", err)
	}
	return out, nil
}

// Reset is one partition's stored offset as an operator moved it.
type Reset struct {
	sinks.TP
	OldOffset *int64 // nil: nothing was stored
	NewOffset int64
	Epoch     int64 // the new owner epoch
}

// Reset moves the stored offsets of partitions to the offsets given, in
// one transaction that also writes an audit row per partition (by actor,
// with detail). Each partition's owner epoch is bumped, as a claim would
// bump it: a member running the partition is fenced at its next commit
// instead of writing its own position over the new one.
func (o *Offsets) Reset(ctx context.Context, actor, detail string, to map[sinks.TP]int64) ([]Reset, error) {
	return o.ResetAs(ctx, deadletters.Actor{Name: actor}, detail, to)
}

// ResetAs is Reset by who: its audit rows record the operating-system
// user too, and the database session user of the transaction.
func (o *Offsets) ResetAs(ctx context.Context, who deadletters.Actor, detail string, to map[sinks.TP]int64) ([]Reset, error) {
	topics := make([]string, 0, len(to))
	parts := make([]int32, 0, len(to))
	nexts := make([]int64, 0, len(to))
	for tp, next := range to {
		topics, parts, nexts = append(topics, tp.Topic), append(parts, tp.Partition), append(nexts, next)
	}
	var out []Reset
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		// The rows are locked in key order, as Claim locks them, so that
		// a reset and a claim of the same partitions cannot deadlock.
		rows, err := tx.Query(ctx, `SELECT o.topic, o.partition, o.next_offset FROM projector_offsets o
			JOIN unnest($2::text[], $3::int[]) AS u(topic, partition) USING (topic, partition)
			WHERE o.identity = $1 ORDER BY o.topic, o.partition FOR UPDATE OF o`, o.identity, topics, parts)
		if err != nil {
			return err
		}
		old := map[sinks.TP]*int64{}
		var tp sinks.TP
		var next *int64
		if _, err := pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &next}, func() error {
			old[tp] = next
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `INSERT INTO projector_offsets AS o (identity, topic, partition, next_offset, owner_epoch)
			SELECT $1, u.topic, u.partition, u.next, 1 FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(topic, partition, next)
			ORDER BY 2, 3
			ON CONFLICT (identity, topic, partition)
			DO UPDATE SET next_offset = excluded.next_offset, owner_epoch = o.owner_epoch + 1, updated_at = now()
			RETURNING o.topic, o.partition, o.next_offset, o.owner_epoch`, o.identity, topics, parts, nexts)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reset, error) {
			var x Reset
			if err := r.Scan(&x.Topic, &x.Partition, &x.NewOffset, &x.Epoch); err != nil {
				return x, err
			}
			x.OldOffset = old[x.TP]
			return x, nil
		})
		if err != nil {
			return err
		}
		slices.SortFunc(out, func(a, b Reset) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
		})
		for _, x := range out {
			if _, err := tx.Exec(ctx, `INSERT INTO projector_offsets_audit
				(actor, os_user, db_user, identity, topic, partition, old_offset, new_offset, owner_epoch, detail)
				VALUES ($1, $9, session_user, $2, $3, $4, $5, $6, $7, $8)`,
				who.Name, o.identity, x.Topic, x.Partition, x.OldOffset, x.NewOffset, x.Epoch, detail, who.OSUser); err != nil {
				return fmt.Errorf("audit: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reset %d stored offsets: %w", len(to), err)
	}
	return out, nil
}

// ResetAudit is one row of the offset-reset audit log.
type ResetAudit struct {
	Reset
	ID    int64
	At    time.Time
	Actor string
	// OSUser is the operating-system user of the command that reset (""
	// when not recorded); DBUser the database session user.
	OSUser, DBUser string
	Identity       string
	Detail         string
}

// ListResets returns the identity's offset resets, newest first (at most
// limit when limit is positive).
func (o *Offsets) ListResets(ctx context.Context, limit int) ([]ResetAudit, error) {
	q := `SELECT id, at, actor, os_user, db_user, identity, topic, partition, old_offset, new_offset, owner_epoch, detail
		FROM projector_offsets_audit WHERE identity = $1 ORDER BY id DESC`
	args := []any{o.identity}
	if limit > 0 {
		q += ` LIMIT $2`
		args = append(args, limit)
	}
	rows, err := o.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list offset resets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ResetAudit, error) {
		var a ResetAudit
		return a, r.Scan(&a.ID, &a.At, &a.Actor, &a.OSUser, &a.DBUser, &a.Identity, &a.Topic, &a.Partition, &a.OldOffset, &a.NewOffset, &a.Epoch, &a.Detail)
	})
	if err != nil {
		return nil, fmt.Errorf("list offset resets: %w", err)
	}
	return out, nil
}
