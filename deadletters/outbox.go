package deadletters

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/sinks"
)

// Outboxed is a dead letter waiting in the outbox to be published, with
// what its dead-letter topic record carries.
type Outboxed struct {
	ID         int64  // the dead letter's id
	DLQTopic   string // the topic to publish it to
	Identity   string
	Topic      string // the topic it came from
	Partition  int32
	Offset     int64
	Key, Value []byte
	Headers    []sinks.Header
	Error      string
	ErrorClass string
}

// claimSQL takes the oldest outbox rows and finds each one's dead letter
// through its primary key (LATERAL ... LIMIT 1): as a plain join, before
// Postgres had analyzed the tables, it read every dead letter to hash
// them.
const claimSQL = `SELECT o.dead_letter_id, o.topic, d.identity, d.topic, d.partition, d."offset",
		d.record_key, d.value, d.headers, d.error, d.error_class
	FROM (SELECT dead_letter_id, topic, created_at FROM projector_dlq_outbox
	      ORDER BY created_at, dead_letter_id
	      LIMIT $1
	      FOR UPDATE SKIP LOCKED) o
	CROSS JOIN LATERAL (SELECT * FROM projector_dead_letters d WHERE d.id = o.dead_letter_id LIMIT 1) d
	ORDER BY o.created_at, o.dead_letter_id`

// ClaimOutbox reads, in tx, up to limit of the oldest outbox rows with
// their dead letters, locking them (rows another transaction holds are
// skipped) until tx ends.
func ClaimOutbox(ctx context.Context, tx pgx.Tx, limit int) ([]Outboxed, error) {
	rows, err := tx.Query(ctx, claimSQL, limit)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Outboxed, error) {
		var (
			o       Outboxed
			headers []byte
		)
		if err := row.Scan(&o.ID, &o.DLQTopic, &o.Identity, &o.Topic, &o.Partition, &o.Offset,
			&o.Key, &o.Value, &headers, &o.Error, &o.ErrorClass); err != nil {
			return o, err
		}
		if err := json.Unmarshal(headers, &o.Headers); err != nil {
			return o, fmt.Errorf("dead letter %d: headers: %w", o.ID, err)
		}
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	return out, nil
}

// Execer runs a statement: a connection, a pool or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DeleteOutboxed removes published dead letters from the outbox.
func DeleteOutboxed(ctx context.Context, db Execer, ids []int64) error {
	if _, err := db.Exec(ctx, `DELETE FROM projector_dlq_outbox WHERE dead_letter_id = ANY($1::bigint[])`, ids); err != nil {
		return fmt.Errorf("remove %d published dead letters from the outbox: %w", len(ids), err)
	}
	return nil
}
