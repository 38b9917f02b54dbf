package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/sinks"
)

// Store makes the Postgres sinks and offset stores of an engine, all on
// one pool: hand it to the engine (projector.Config.Store). Call Migrate
// first.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns the store of pool.
func NewStore(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool}
}

// Offsets returns the offset store of a consumer identity.
func (s *Store) Offsets(identity string) sinks.Offsets {
	return NewOffsets(s.pool, identity)
}

// Sink returns the sink of one projection of a consumer identity, with
// its state cache bounded as t says.
func (s *Store) Sink(t sinks.Target) (sinks.Sink, error) {
	sink := NewSink(s.pool, t.Identity, t.Projection, t.DLQTopic)
	if t.StateCacheRows != 0 || t.StateCacheBytes != 0 {
		rows, bytes := t.StateCacheRows, t.StateCacheBytes
		if rows == 0 {
			rows = DefaultStateCacheRows
		}
		if bytes == 0 {
			bytes = DefaultStateCacheBytes
		}
		sink.SetStateCache(max(0, rows), max(0, bytes))
	}
	return sink, nil
}

// Ping reports whether Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.pool.Ping(ctx)
}

// DeadLetterDepth counts the open dead letters of each projection of
// identity that has any.
func (s *Store) DeadLetterDepth(ctx context.Context, identity string) (map[string]int64, error) {
	return deadletters.Depth(ctx, s.pool, identity)
}

// DeadLetterPool is the pool the dead letters' publish outbox is read
// from.
func (s *Store) DeadLetterPool() *pgxpool.Pool {
	return s.pool
}
