package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/partition"
)

// DeadLetter is one stored dead letter.
type DeadLetter struct {
	ID         int64              `json:"id"`
	Identity   string             `json:"identity"`
	Projection string             `json:"projection"`
	Topic      string             `json:"topic"`
	Partition  int32              `json:"partition"`
	Offset     int64              `json:"offset"`
	Key        string             `json:"key"`
	Value      []byte             `json:"value"`
	Headers    []partition.Header `json:"headers"`
	RecordTime *time.Time         `json:"record_time,omitempty"`
	Error      string             `json:"error"`
	Attempts   int                `json:"attempts"`
	FirstSeen  time.Time          `json:"first_seen"`
	LastSeen   time.Time          `json:"last_seen"`
}

// DeadLetterFilter narrows ListDeadLetters; zero fields match everything.
type DeadLetterFilter struct {
	Identity   string
	Projection string
	Topic      string
	Limit      int
}

// ListDeadLetters returns dead letters, oldest first.
func ListDeadLetters(ctx context.Context, pool *pgxpool.Pool, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	rows, err := pool.Query(ctx, `
		SELECT id, identity, projection, topic, partition, "offset", coalesce(record_key, ''), coalesce(value, ''),
		       headers, record_time, error, attempts, first_seen, last_seen
		FROM projector_dead_letters
		WHERE ($1 = '' OR identity = $1) AND ($2 = '' OR projection = $2) AND ($3 = '' OR topic = $3)
		ORDER BY id LIMIT $4`, f.Identity, f.Projection, f.Topic, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var (
			d       DeadLetter
			key     []byte
			headers []byte
		)
		if err := r.Scan(&d.ID, &d.Identity, &d.Projection, &d.Topic, &d.Partition, &d.Offset, &key, &d.Value,
			&headers, &d.RecordTime, &d.Error, &d.Attempts, &d.FirstSeen, &d.LastSeen); err != nil {
			return d, err
		}
		d.Key = string(key)
		return d, json.Unmarshal(headers, &d.Headers)
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}
