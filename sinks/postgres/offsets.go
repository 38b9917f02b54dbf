package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/partition"
)

// Offsets stores the next offset of every partition a consumer identity
// owns, and the owner epoch that fences older owners.
type Offsets struct {
	pool     *pgxpool.Pool
	identity string
}

// NewOffsets returns the offset store of identity. Each call waits at most
// DefaultAcquireTimeout for a connection of pool.
func NewOffsets(pool *pgxpool.Pool, identity string) *Offsets {
	return &Offsets{pool: pool, identity: identity}
}

// Claimed is the result of claiming one partition. NextOffset is nil when
// nothing was ever stored for it.
type Claimed struct {
	partition.TP
	Epoch      int64
	NextOffset *int64
	At         time.Time // once Postgres had stored the claim
}

// Claim takes ownership of partitions: it bumps each one's owner epoch,
// which fences every earlier owner, and returns where to resume. All
// partitions are claimed in one statement.
func (o *Offsets) Claim(ctx context.Context, tps []partition.TP) ([]Claimed, error) {
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
		return nil, fmt.Errorf("claim %d partitions: %w", len(tps), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		return c, r.Scan(&c.Topic, &c.Partition, &c.Epoch, &c.NextOffset)
	})
	if err != nil {
		return nil, fmt.Errorf("claim %d partitions: %w", len(tps), err)
	}
	at := time.Now()
	for i := range out {
		out[i].At = at
	}
	return out, nil
}

// Init sets the first offset of a claimed partition that had none stored.
// It returns partition.ErrFenced when a newer owner exists.
func (o *Offsets) Init(ctx context.Context, c Claimed, next int64) error {
	conn, err := acquire(ctx, o.pool, DefaultAcquireTimeout)
	if err != nil {
		return fmt.Errorf("store first offset of %s/%d: %w", c.Topic, c.Partition, err)
	}
	defer conn.Release()
	tag, err := conn.Exec(ctx, `UPDATE projector_offsets SET next_offset = $1, updated_at = now()
		WHERE identity = $2 AND topic = $3 AND partition = $4 AND owner_epoch = $5 AND next_offset IS NULL`,
		next, o.identity, c.Topic, c.Partition, c.Epoch)
	if err != nil {
		return fmt.Errorf("store first offset of %s/%d: %w", c.Topic, c.Partition, err)
	}
	if tag.RowsAffected() == 0 {
		return partition.ErrFenced
	}
	return nil
}

// Stored is one partition's stored position.
type Stored struct {
	partition.TP
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
