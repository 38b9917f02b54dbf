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

// NewOffsets returns the offset store of identity.
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
	rows, err := o.pool.Query(ctx, `
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
	tag, err := o.pool.Exec(ctx, `UPDATE projector_offsets SET next_offset = $1, updated_at = now()
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

// InitAll sets the first offsets of claimed partitions that had none
// stored, firsts[i] for claims[i], in one statement. It returns the
// partitions it set: one left out has a newer owner.
func (o *Offsets) InitAll(ctx context.Context, claims []Claimed, firsts []int64) ([]partition.TP, error) {
	topics := make([]string, len(claims))
	parts := make([]int32, len(claims))
	epochs := make([]int64, len(claims))
	for i, c := range claims {
		topics[i], parts[i], epochs[i] = c.Topic, c.Partition, c.Epoch
	}
	rows, err := o.pool.Query(ctx, `UPDATE projector_offsets AS o SET next_offset = u.next, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS u(topic, partition, epoch, next)
		WHERE o.identity = $1 AND o.topic = u.topic AND o.partition = u.partition
		  AND o.owner_epoch = u.epoch AND o.next_offset IS NULL
		RETURNING o.topic, o.partition`, o.identity, topics, parts, epochs, firsts)
	if err != nil {
		return nil, fmt.Errorf("store first offsets of %d partitions: %w", len(claims), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition.TP, error) {
		var tp partition.TP
		return tp, r.Scan(&tp.Topic, &tp.Partition)
	})
	if err != nil {
		return nil, fmt.Errorf("store first offsets of %d partitions: %w", len(claims), err)
	}
	return out, nil
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
