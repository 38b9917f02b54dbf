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

// RecordStates stores what member says of partitions of identity (see
// sinks.PartitionState), in one transaction: a state is stored, a zero
// State removes what was stored. Members call it when a state changes,
// never per batch.
func (s *Store) RecordStates(ctx context.Context, identity, member string, states []sinks.PartitionState) error {
	var (
		topics, clearTopics   []string
		parts, clearParts     []int32
		names, halts, reasons []string
		members               []string
		since                 []time.Time
	)
	for _, st := range states {
		if st.State == "" {
			clearTopics, clearParts = append(clearTopics, st.Topic), append(clearParts, st.Partition)
			continue
		}
		topics, parts = append(topics, st.Topic), append(parts, st.Partition)
		names, halts, reasons = append(names, st.State), append(halts, st.Halt), append(reasons, st.Reason)
		members, since = append(members, member), append(since, st.Since)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if len(clearTopics) > 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM projector_partition_states AS s
				USING unnest($2::text[], $3::int[]) AS u(topic, partition)
				WHERE s.identity = $1 AND s.topic = u.topic AND s.partition = u.partition`, identity, clearTopics, clearParts); err != nil {
				return err
			}
		}
		if len(topics) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO projector_partition_states AS s (identity, topic, partition, state, halt, reason, member, since)
				SELECT $1, u.* FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[]) AS u
				ORDER BY 2, 3
				ON CONFLICT (identity, topic, partition) DO UPDATE
				SET state = excluded.state, halt = excluded.halt, reason = excluded.reason, member = excluded.member, since = excluded.since, updated_at = now()`,
				identity, topics, parts, names, halts, reasons, members, since); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record the states of %d partitions: %w", len(states), err)
	}
	return nil
}

// PartitionStates returns the partition states recorded for identity,
// for the engine (see projector.StateReader).
func (s *Store) PartitionStates(ctx context.Context, identity string) (map[sinks.TP]sinks.PartitionState, error) {
	stored, err := States(ctx, s.pool, identity)
	if err != nil {
		return nil, err
	}
	out := make(map[sinks.TP]sinks.PartitionState, len(stored))
	for tp, st := range stored {
		out[tp] = st.PartitionState
	}
	return out, nil
}

// StoredState is a partition's state as its member last recorded it.
type StoredState struct {
	sinks.PartitionState
	Member    string
	UpdatedAt time.Time
}

// States returns the partition states recorded for identity (see
// RecordStates); none where the table does not exist yet. A table from
// before halts were named (not migrated since) is read without them.
func States(ctx context.Context, pool *pgxpool.Pool, identity string) (map[sinks.TP]StoredState, error) {
	list, err := readStates(ctx, pool, identity, "halt")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column: the halt column
		list, err = readStates(ctx, pool, identity, "''")
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: not migrated since
		return map[sinks.TP]StoredState{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read partition states: %w", err)
	}
	out := make(map[sinks.TP]StoredState, len(list))
	for _, s := range list {
		out[s.TP] = s
	}
	return out, nil
}

// readStates reads the states of identity, with halt the expression of
// the halt column.
func readStates(ctx context.Context, pool *pgxpool.Pool, identity, halt string) ([]StoredState, error) {
	rows, err := pool.Query(ctx, `SELECT topic, partition, state, `+halt+`, reason, since, member, updated_at
		FROM projector_partition_states WHERE identity = $1`, identity)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredState, error) {
		var s StoredState
		return s, r.Scan(&s.Topic, &s.Partition, &s.State, &s.Halt, &s.Reason, &s.Since, &s.Member, &s.UpdatedAt)
	})
}
