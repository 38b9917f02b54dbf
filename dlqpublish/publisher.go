package dlqpublish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/partition"
)

// Kafka Connect's dead-letter-queue context headers, which Publisher adds
// to every record it publishes.
const (
	HeaderTopic          = "__connect.errors.topic"
	HeaderPartition      = "__connect.errors.partition"
	HeaderOffset         = "__connect.errors.offset"
	HeaderExceptionClass = "__connect.errors.exception.class.name"
	HeaderMessage        = "__connect.errors.exception.message"
	HeaderConnector      = "__connect.errors.connector.name"
)

// BatchSize is the most outbox rows one round publishes.
const BatchSize = 500

// DefaultInterval is how long Publisher waits between rounds that found
// nothing more to do.
const DefaultInterval = time.Second

// lockClass is the first key of the advisory lock that lets one publisher
// at a time work on a schema's outbox ("dlqp"); the second key is the
// schema's hash.
const lockClass = 0x646c7170

// Publisher copies dead letters to dead-letter topics: each row of
// projector_dlq_outbox names a dead letter and the topic to publish it to;
// the published record has the dead letter's original key, value and
// headers, plus Kafka Connect's error headers (HeaderTopic …
// HeaderConnector: the original topic, partition and offset, the error
// class, the error, and the consumer identity) and IDHeader.
//
// Delivery is at least once. A round claims up to BatchSize outbox rows
// in a short transaction (FOR UPDATE SKIP LOCKED), commits it, produces
// the records, and deletes the outbox rows of the acknowledged records
// afterwards: no transaction stays open while producing. A crash (or a
// failed delete) between the acknowledgement and the delete publishes
// that batch again, at most BatchSize records, on the next round.
//
// Replicas running a Publisher on the same schema take turns: a round
// holds a session advisory lock (not a transaction) for its duration, and
// a replica that cannot get it waits for the next interval, so two
// replicas do not publish the same rows at once.
type Publisher struct {
	pool     *pgxpool.Pool
	cl       *kgo.Client
	log      *slog.Logger
	interval time.Duration
}

// New returns a Publisher producing with cl. interval is how long it
// waits when idle or after a failed round (DefaultInterval when not
// positive); log may be nil.
func New(pool *pgxpool.Pool, cl *kgo.Client, log *slog.Logger, interval time.Duration) *Publisher {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{pool: pool, cl: cl, log: log, interval: interval}
}

// Run publishes until ctx ends, then returns nil. A full batch is followed
// by the next round at once; otherwise it waits interval. Failed rounds
// are logged and retried after interval.
func (p *Publisher) Run(ctx context.Context) error {
	for {
		n, err := p.PublishBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			p.log.Error("publish dead letters", "err", err)
		} else if n == BatchSize {
			continue
		}
		t := time.NewTimer(p.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// outboxRow is one claimed outbox row with its dead letter.
type outboxRow struct {
	id         int64
	dlqTopic   string
	identity   string
	topic      string
	partition  int32
	offset     int64
	key, value []byte
	headers    []partition.Header
	errText    string
	errClass   string
}

// claimSQL takes the oldest outbox rows and finds each one's dead letter
// through its primary key (LATERAL ... LIMIT 1): as a plain join, before
// Postgres had analyzed the tables, it read every dead letter to hash
// them on every round.
const claimSQL = `SELECT o.dead_letter_id, o.topic, d.identity, d.topic, d.partition, d."offset",
		d.record_key, d.value, d.headers, d.error, d.error_class
	FROM (SELECT dead_letter_id, topic, created_at FROM projector_dlq_outbox
	      ORDER BY created_at, dead_letter_id
	      LIMIT $1
	      FOR UPDATE SKIP LOCKED) o
	CROSS JOIN LATERAL (SELECT * FROM projector_dead_letters d WHERE d.id = o.dead_letter_id LIMIT 1) d
	ORDER BY o.created_at, o.dead_letter_id`

// acquireTimeout bounds a round's wait for a connection of the pool.
const acquireTimeout = 30 * time.Second

// PublishBatch runs one round: it publishes up to BatchSize outbox rows and
// returns how many it published (0 as well when another publisher holds
// the schema's turn).
func (p *Publisher) PublishBatch(ctx context.Context) (int, error) {
	// The pool is the partitions' too: a round that finds no connection
	// free in time fails, and the next one tries again.
	actx, cancel := context.WithTimeout(ctx, acquireTimeout)
	conn, err := p.pool.Acquire(actx)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("acquire connection: %w", err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext(current_schema()))`, lockClass).Scan(&locked); err != nil {
		conn.Release()
		return 0, fmt.Errorf("take publisher lock: %w", err)
	}
	if !locked {
		conn.Release()
		return 0, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`, lockClass); err != nil {
			// Closing the session releases its locks.
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}()

	rows, err := p.claim(ctx, conn)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	recs := make([]*kgo.Record, len(rows))
	ids := make(map[*kgo.Record]int64, len(rows))
	for i, r := range rows {
		recs[i] = r.record()
		ids[recs[i]] = r.id
	}
	results := p.cl.ProduceSync(ctx, recs...)
	var (
		done     []int64
		firstErr error
	)
	for _, res := range results {
		if res.Err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("produce dead letter %d to %s: %w", ids[res.Record], res.Record.Topic, res.Err)
			}
			continue
		}
		done = append(done, ids[res.Record])
	}
	if len(done) > 0 {
		// The records are out: forget them even if ctx ended meanwhile.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
		_, err := conn.Exec(dctx, `DELETE FROM projector_dlq_outbox WHERE dead_letter_id = ANY($1::bigint[])`, done)
		cancel()
		if err != nil {
			return 0, errors.Join(firstErr, fmt.Errorf("%d dead letters published, but removing them from the outbox failed (they will be published again): %w", len(done), err))
		}
		p.log.Debug("published dead letters", "count", len(done))
	}
	return len(done), firstErr
}

// claim reads up to BatchSize outbox rows with their dead letters in a
// short transaction.
func (p *Publisher) claim(ctx context.Context, conn *pgxpool.Conn) ([]outboxRow, error) {
	var out []outboxRow
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, claimSQL, BatchSize)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
			var (
				r       outboxRow
				headers []byte
			)
			if err := row.Scan(&r.id, &r.dlqTopic, &r.identity, &r.topic, &r.partition, &r.offset,
				&r.key, &r.value, &headers, &r.errText, &r.errClass); err != nil {
				return r, err
			}
			if err := json.Unmarshal(headers, &r.headers); err != nil {
				return r, fmt.Errorf("dead letter %d: headers: %w", r.id, err)
			}
			return r, nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	return out, nil
}

// record is the dead-letter topic record of r: the original headers
// (without the ones Publisher sets, which it replaces), then Kafka
// Connect's error headers, then IDHeader.
func (r outboxRow) record() *kgo.Record {
	added := []kgo.RecordHeader{
		{Key: HeaderTopic, Value: []byte(r.topic)},
		{Key: HeaderPartition, Value: []byte(strconv.FormatInt(int64(r.partition), 10))},
		{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.offset, 10))},
		{Key: HeaderExceptionClass, Value: []byte(r.errClass)},
		{Key: HeaderMessage, Value: []byte(r.errText)},
		{Key: HeaderConnector, Value: []byte(r.identity)},
		{Key: IDHeader, Value: []byte(strconv.FormatInt(r.id, 10))},
	}
	replaced := make(map[string]bool, len(added))
	for _, h := range added {
		replaced[h.Key] = true
	}
	headers := make([]kgo.RecordHeader, 0, len(r.headers)+len(added))
	for _, h := range r.headers {
		if !replaced[h.Key] {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	headers = append(headers, added...)
	return &kgo.Record{Topic: r.dlqTopic, Key: r.key, Value: r.value, Headers: headers}
}
