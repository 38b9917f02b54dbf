package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/outbox"
)

// Source is the demo's source service: it keeps its own accounts table
// and, in the same transaction as each change, appends the event to the
// transactional outbox, from which the relay publishes it.
type Source struct {
	pool *pgxpool.Pool
	enc  *Encoder
}

// NewSource creates the source service's table (and the outbox).
func NewSource(ctx context.Context, pool *pgxpool.Pool, enc *Encoder) (*Source, error) {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS source_accounts (
		account_id text PRIMARY KEY, version bigint NOT NULL, last_event text NOT NULL, changed_at timestamptz NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create source_accounts: %w", err)
	}
	return &Source{pool: pool, enc: enc}, nil
}

// Run replays the generated stream through the source: the first copy of
// every event is a business change plus an outbox row, committed together
// (one transaction per chunk of the stream, as a busy service would); the
// stream's duplicates and poison pills go straight to the topic through
// chaos, the way a misbehaving producer would send them. progress, if not
// nil, gets the number of records handled so far.
func (s *Source) Run(ctx context.Context, chaos *kgo.Client, records []Record, progress func(done int)) error {
	const chunk = 1000
	seen := make(map[string]map[int64]bool)
	for start := 0; start < len(records); start += chunk {
		end := min(start+chunk, len(records))
		var (
			events []outbox.Event
			direct []Record
		)
		for _, r := range records[start:end] {
			if r.Poison != "" || seen[r.Key][r.Event.Version] {
				direct = append(direct, r)
				continue
			}
			if seen[r.Key] == nil {
				seen[r.Key] = map[int64]bool{}
			}
			seen[r.Key][r.Event.Version] = true
			value, err := s.enc.Encode(r)
			if err != nil {
				return fmt.Errorf("encode %s v%d: %w", r.Key, r.Event.Version, err)
			}
			events = append(events, outbox.Event{
				AggregateType: "account", AggregateID: r.Key, Version: r.Event.Version, Type: r.Event.Type,
				Topic: s.enc.Topic, Payload: value, Source: "/demo/accounts-service", Time: r.Event.OccurredAt,
			})
		}
		if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := s.change(ctx, tx, events); err != nil {
				return err
			}
			return outbox.Append(ctx, tx, events...)
		}); err != nil {
			return fmt.Errorf("source transaction: %w", err)
		}
		if len(direct) > 0 {
			if err := Produce(ctx, chaos, s.enc, direct, nil); err != nil {
				return err
			}
		}
		if progress != nil {
			progress(end)
		}
	}
	return nil
}

// change applies a chunk's events to the source's own table, set-based.
func (s *Source) change(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	ids := make([]string, len(events))
	versions := make([]int64, len(events))
	types := make([]string, len(events))
	for i, e := range events {
		ids[i], versions[i], types[i] = e.AggregateID, e.Version, e.Type
	}
	_, err := tx.Exec(ctx, `INSERT INTO source_accounts (account_id, version, last_event, changed_at)
		SELECT DISTINCT ON (id) id, v, t, $4 FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(id, v, t)
		ORDER BY id, v DESC
		ON CONFLICT (account_id) DO UPDATE SET version = excluded.version, last_event = excluded.last_event, changed_at = excluded.changed_at
		WHERE source_accounts.version < excluded.version`, ids, versions, types, time.Now())
	if err != nil {
		return fmt.Errorf("update source_accounts: %w", err)
	}
	return nil
}

// Pending counts outbox rows not yet published.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NULL`).Scan(&n)
	return n, err
}
